"""One rank of an executed partition plan: ``dlcomm run-job partition --config JOB.json``.

Started by launch.py through dlcomm's launcher (the env:// variables, a failure report for
the launcher). For every plan in the job, trains ``steps`` steps of SGD and writes
``OUT/rank<r>.json`` (losses, times, elements sent and received per key) and
``OUT/rank<r>.pt`` (the gradient shards of every step), OUT being the job's ``out_dir``.
"""

from __future__ import annotations

import json
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from dlcomm.plan.partition.execute.comm import Comm
from dlcomm.plan.partition.execute.model import (
    PartitionedNet,
    build_program,
    executable_table,
    init_weights,
    make_batch,
)
from dlcomm.plan.partition.graph import build_graph
from dlcomm.runtime.env import WorkerEnv, process_group, set_threads
from dlcomm.workloads.catalog.base import Layer, ModelTable

__all__ = ["table_to_dict", "table_from_dict", "run_rank", "worker_main"]


def table_to_dict(table: ModelTable) -> dict[str, Any]:
    return {"name": table.name, "family": table.family, "sample": table.sample,
            "published_params": table.published_params, "source": table.source,
            "default_batch": table.default_batch,
            "layers": [{f.name: getattr(x, f.name) for f in fields(Layer)} for x in table.layers]}


def table_from_dict(d: dict[str, Any]) -> ModelTable:
    return ModelTable(d["name"], d["family"], tuple(Layer(**x) for x in d["layers"]),
                      d["sample"], d["published_params"], d["source"], d["default_batch"])


def run_rank(job: dict[str, Any], rank: int, world: int) -> tuple[dict[str, Any], dict]:
    """Train every plan of the job on this rank; return the report and gradient shards."""
    table = executable_table(table_from_dict(job["table"]))
    program, graph = build_program(table), build_graph(table)
    dtype = getattr(torch, job.get("dtype", "float32"))
    report: dict[str, Any] = {"rank": rank, "plans": []}
    shards: dict[int, list] = {}
    for i, spec in enumerate(job["plans"]):
        comm = Comm(rank, world)
        weights = init_weights(program, job["seed"], dtype)
        net = PartitionedNet(program, graph, spec["types"], spec["splits"], job["batch"], comm,
                             weights, spec["slowdowns"][rank])
        steps, grads = [], []
        for step in range(job["steps"]):
            if job.get("fail_rank") == rank and step == job["steps"] - 1:
                raise RuntimeError("injected failure")
            x, target = make_batch(program, job["batch"], job["seed"], step, dtype)
            start, comm_before, compute_before = (time.perf_counter(), comm.seconds,
                                                  net.clock.seconds)
            loss = net.loss(net.forward(x), target)
            loss.backward()
            net.reduce_gradients()
            grads.append(net.gradients())
            net.sgd(job["lr"])
            steps.append({"loss": float(loss), "step_s": time.perf_counter() - start,
                          "comm_s": comm.seconds - comm_before,
                          "compute_s": net.clock.seconds - compute_before})
        report["plans"].append({"steps": steps, "sent": dict(comm.sent),
                                "received": dict(comm.received)})
        shards[i] = grads
    return report, shards


def worker_main(job: dict[str, Any]) -> None:
    """One rank of the job (run by ``dlcomm run-job partition``)."""
    env = WorkerEnv.from_environ()
    out = Path(job["out_dir"])
    set_threads(1)
    with process_group(env, job["timeout_s"]):
        report, shards = run_rank(job, env.rank, env.world_size)
        torch.save(shards, out / f"rank{env.rank}.pt")
        (out / f"rank{env.rank}.json").write_text(json.dumps(report))
