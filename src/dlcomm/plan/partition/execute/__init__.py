"""Executed partition plans: run a plan on p local ranks, check gradients and bytes.

    from dlcomm.plan.partition.execute import ExecPlan, execute
    runs = execute(table, [ExecPlan(types, splits, slowdowns)], batch=8, steps=2)
    assert runs[0].gradients_match and runs[0].bytes_match

For each plan: every rank trains ``steps`` SGD steps on its shards (model.py); the
gradient shards of every step are compared with single-process training of the same
network from the same weights and batches, and the elements each rank sent and received
per edge and layer are compared with the cost model's (expected.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan.partition.execute.expected import expected_elements, split_dims
from dlcomm.plan.partition.graph import PartitionGraph
from dlcomm.plan.partition.layouts import integer_split
from dlcomm.workloads.catalog.base import ModelTable

__all__ = ["ExecPlan", "Execution", "execute", "integer_splits", "DTYPES"]

DTYPES = {"float32": 4, "float64": 8}  # element types the ranks compute and send, in bytes


@dataclass(frozen=True)
class ExecPlan:
    types: list[int]              # per partitioned layer: 0 (I), 1 (II), 2 (III)
    splits: list[list[int]]       # per layer, the integer parts of the split dimension
    slowdowns: list[float]        # per rank, >= 1: emulated slower devices


@dataclass(frozen=True)
class Execution:
    plan: ExecPlan
    steps: int
    max_grad_error: float                     # max |distributed - single process|
    tolerance: float
    measured: list[dict[str, tuple[int, int]]]   # per rank: key -> (sent, received) elements
    expected: dict[str, tuple[list[int], list[int]]]  # key -> per rank, per step
    ranks: list[dict[str, Any]] = field(default_factory=list)  # per rank: step reports
    losses: list[float] = field(default_factory=list)          # single-process, per step
    dtype: str = "float32"
    grad_scale: float = 0.0                   # max |single-process gradient|

    @property
    def bytes_per_element(self) -> int:
        return DTYPES[self.dtype]

    @property
    def gradients_match(self) -> bool:
        return self.max_grad_error <= self.tolerance

    def mismatches(self) -> list[str]:
        """Keys where the measured elements differ from the model's (empty if none)."""
        out = []
        for rank, measured in enumerate(self.measured):
            for key in sorted(set(measured) | set(self.expected)):
                sent, recv = self.expected.get(key, ([0] * len(self.measured),) * 2)
                want = (sent[rank] * self.steps, recv[rank] * self.steps)
                got = measured.get(key, (0, 0))
                if tuple(got) != want:
                    out.append(f"rank {rank} {key}: measured {got}, model {want}")
        return out

    @property
    def bytes_match(self) -> bool:
        return not self.mismatches()


def integer_splits(graph: PartitionGraph, types: list[int], shares: np.ndarray,
                   batch: int) -> list[list[int]]:
    """Integer parts of each layer's split dimension from a plan's shares (N, p)."""
    return [integer_split(d, s) for d, s in zip(split_dims(graph, types, batch), shares)]


def execute(table: ModelTable, plans: list[ExecPlan], *, batch: int, steps: int = 1,
            seed: int = 0, lr: float = 0.01, timeout_s: float = 60.0,
            tolerance: float = 1e-5, dtype: str = "float32") -> list[Execution]:
    """Run each plan on p local ranks and check it (module docstring)."""
    import torch

    from dlcomm.plan.partition.execute.launch import run_job
    from dlcomm.plan.partition.execute.model import (
        build_program,
        executable_table,
        init_weights,
        make_batch,
        reference_step,
    )
    from dlcomm.plan.partition.execute.worker import table_to_dict
    from dlcomm.plan.partition.graph import build_graph

    table = executable_table(table)
    program, graph = build_program(table), build_graph(table)
    world = len(plans[0].slowdowns)
    dims = None
    for plan in plans:
        dims = split_dims(graph, plan.types, batch)
        if len(plan.types) != len(graph) or len(plan.splits) != len(graph):
            raise ConfigError(f"a plan for {table.name} needs {len(graph)} layers")
        if len(plan.slowdowns) != world or any(len(s) != world for s in plan.splits):
            raise ConfigError("every plan needs one part and one slowdown per rank")
        if any(sum(s) != d or min(s) < 0 for s, d in zip(plan.splits, dims)):
            raise ConfigError("each split must cover its dimension with parts >= 0")
    if not 2 <= world <= 8:
        raise ConfigError(f"executed plans run on 2 to 8 local ranks, not {world}")
    if steps < 1 or batch < world:
        raise ConfigError("need steps >= 1 and a batch of at least one sample per rank")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    job = {"table": table_to_dict(table), "batch": batch, "steps": steps, "seed": seed,
           "lr": lr, "dtype": dtype, "plans": [{"types": p.types, "splits": p.splits,
                                "slowdowns": p.slowdowns} for p in plans]}
    results = run_job(job, world, timeout_s)

    # the single-process reference: same weights, batches and SGD steps
    torch_dtype = getattr(torch, dtype)
    weights = {k: list(v) for k, v in init_weights(program, seed, torch_dtype).items()}
    reference, losses = [], []
    for step in range(steps):
        x, target = make_batch(program, batch, seed, step, torch_dtype)
        loss, grads = reference_step(program, weights, x, target)
        reference.append(grads)
        losses.append(loss)
        for k in weights:
            weights[k] = [w - lr * g for w, g in zip(weights[k], grads[k])]

    scale = max(float(torch.max(torch.abs(g))) for grads in reference
                for tensors in grads.values() for g in tensors)
    out = []
    for i, plan in enumerate(plans):
        error = 0.0
        for rank, (_, shards) in enumerate(results):
            for step, grads in enumerate(shards[i]):
                for node, tensors in grads.items():
                    full = reference[step][node]
                    t, (lo, hi) = plan.types[node], _part(plan.splits[node], rank)
                    for j, (mine, ref) in enumerate(zip(tensors, full)):
                        if t == 1 and j == 0:
                            ref = ref.narrow(1, lo, hi - lo)
                        elif t == 2:
                            ref = ref.narrow(0, lo, hi - lo)
                        if mine.numel():
                            error = max(error, float(torch.max(torch.abs(mine - ref))))
        measured = [{k: (r["plans"][i]["sent"].get(k, 0), r["plans"][i]["received"].get(k, 0))
                     for k in set(r["plans"][i]["sent"]) | set(r["plans"][i]["received"])}
                    for r, _ in results]
        out.append(Execution(plan, steps, error, tolerance, measured,
                             expected_elements(graph, plan.types, plan.splits, batch),
                             [r["plans"][i] for r, _ in results], losses, dtype, scale))
    return out


def _part(split: list[int], rank: int) -> tuple[int, int]:
    lo = sum(split[:rank])
    return lo, lo + split[rank]
