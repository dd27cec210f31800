"""One simulated iteration as a Chakra trace set: a ``.et`` file per rank, ASTRA-sim's input.

Steps:

1. The iteration's stage plans, rebuilt from the :class:`SimConfig` with the simulator's
   own public pieces, as :func:`dlcomm.plan.simulate.iteration.simulate` builds them
   before it schedules (topology, placement, network, exchange, ``Collectives``,
   ``StagePlanner``).
2. Rank r = (d, s, t) (TP fastest, then PP, then DP: the planner's layout) runs stage s's
   plan: its operations in schedule order (``schedule.stage_order``), per segment a
   COMP_NODE (``duration_micros``; ``num_ops``: the stage's catalog FLOPs per micro-batch
   and rank, backward 2x, split over its segments by time), then the segment's blocking
   collective as a COMM_COLL_NODE on the rank's group of that dimension; each node
   depends on the one before it.
3. Pipeline transfers: after a forward a COMM_SEND_NODE to the peer of stage s+1 (tag:
   the micro-batch), which that peer's forward waits for through a COMM_RECV_NODE;
   gradients back likewise (tag: micro + micro-batch). Sends of one direction depend on
   the one before (the schedule's FIFO per link direction).
4. Gradient buckets of the last backward: one COMM_COLL_NODE each, depending on the
   compute that readies it and on the bucket before it in its queue (DDP's FIFO);
   nothing waits for them but the end of the iteration.
5. Communicator groups: one id (from 1) per group of ranks of every dimension with
   collectives (tp, dp, dp-expert, ep, embedding), named in ``pg_name``.

What a host collective cannot say is left out: in-network aggregation becomes an
ALL_REDUCE of the bucket, compressed buckets the collective of their wire bytes (an
all-gather of every payload for methods that do not sum), and compression time and
calibrated overheads are dropped. ``dlcomm_algorithm`` records the all-reduce algorithm
dlcomm chose (ASTRA-sim takes its own from its system configuration).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan.commtime import group_ranks, place_ranks
from dlcomm.plan.simulate.algorithms import ALLREDUCE
from dlcomm.plan.simulate.chakra import (
    COMM_TYPES,
    NODE_TYPES,
    TraceNode,
    TraceSet,
    publish,
    write_trace_set,
)
from dlcomm.plan.simulate.collective import (
    Call,
    Collectives,
    ExchangeModel,
    measure_compression,
    parse_exchange,
)
from dlcomm.plan.simulate.fluid import SimNetwork
from dlcomm.plan.simulate.iteration import SimConfig, build_topology_for, resolve_parallelism
from dlcomm.plan.simulate.plans import StagePlanner
from dlcomm.plan.simulate.schedule import Segment, StagePlan, stage_order
from dlcomm.plan.topology import Topology
from dlcomm.plan.traffic import Parallelism, stages
from dlcomm.workloads.accelerators import get_accelerator
from dlcomm.workloads.catalog import ModelTable, get_model, iteration_time
from dlcomm.workloads.catalog.compute import BACKWARD_FACTOR

__all__ = ["Iteration", "rebuild", "iteration_traces", "export_chakra", "export_runs"]

COMP, SEND, RECV, COLL = (NODE_TYPES.index(n) for n in (
    "COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE"))
_OPS = {"allreduce": "ALL_REDUCE", "alltoall": "ALL_TO_ALL", "allgather": "ALL_GATHER"}
_DIMS = ("tp", "dp", "dp-expert", "ep", "embedding")
_KNOWN = {"workload", "topology", "accelerators", "parallelism", "exchange", "compress",
          "compress_ratio", "compress_gbps", "density", "sparse_pattern", "accelerator",
          "efficiency", "algorithm", "placement", "schedule", "alpha_us", "hop_latency_us",
          "bucket_mb", "dilation", "link_rate_gbps", "ports", "radix", "replicate_embeddings",
          "seed", "calibration"}   # the SimConfig fields that rebuild() reproduces


@dataclass
class Iteration:
    """What the simulator schedules for one configuration (step 1)."""

    cfg: SimConfig
    model: ModelTable
    topology: Topology
    par: Parallelism
    exchange: ExchangeModel
    plans: list[StagePlan]
    calls: list[Call] = field(default_factory=list)


def _exchange(cfg: SimConfig, world_dp: int) -> ExchangeModel:
    """The DP exchange of ``cfg``, as the simulator builds it."""
    kind, method = parse_exchange(cfg.exchange)
    if cfg.compress and method:
        raise ConfigError("give compression either in --exchange compressed:... or --compress")
    method = method or cfg.compress
    compression = measure_compression(method, max(world_dp, 2), kind == "ring",
                                      cfg.compress_gbps, cfg.compress_ratio) if method else None
    cal = (cfg.calibration or {}).get(kind)
    return ExchangeModel(kind, cfg.density, cfg.sparse_pattern, compression,
                         float(cal["overhead_s"]) if cal else 0.0,
                         float(cal["efficiency"]) if cal else 1.0, cal is not None)


def rebuild(cfg: SimConfig) -> Iteration:
    """The stage plans of ``cfg`` (step 1); options this rebuild does not know (added to the
    simulator after it) are refused rather than silently left out."""
    unknown = [f"--{f.name.replace('_', '-')}" for f in fields(cfg) if f.name not in _KNOWN
               and getattr(cfg, f.name) != f.default]
    if cfg.schedule not in ("1f1b", "gpipe"):
        unknown.append(f"the {cfg.schedule} schedule")
    if cfg.dilation != 1:
        unknown.append("a time dilation")
    if unknown:
        raise ConfigError(f"Chakra export does not model {', '.join(unknown)} (it writes "
                          "1f1b and gpipe iterations at real scale)")
    model = get_model(cfg.workload)
    topo = build_topology_for(cfg)
    n = cfg.accelerators or topo.accelerators
    par = resolve_parallelism(cfg.parallelism, model, min(n, topo.accelerators),
                              cfg.replicate_embeddings)
    net = SimNetwork(topo, place_ranks(par, topo.accelerators, cfg.placement, cfg.seed))
    exchange = _exchange(cfg, par.dp)
    coll = Collectives(net, par, exchange, cfg.algorithm, cfg.alpha_us * 1e-6,
                       cfg.hop_latency_us * 1e-6)
    per_sample = iteration_time(model, get_accelerator(cfg.accelerator, cfg.efficiency), 1,
                                cfg.efficiency)
    scale = par.batch / par.micro_batches / par.tp
    fwd = [t * scale for _, t in per_sample.forward]
    bwd = [t * scale for _, t in reversed(per_sample.backward)]
    builder = StagePlanner(model, par, coll, fwd, bwd,
                           model.family == "recommender" and not cfg.replicate_embeddings,
                           int(cfg.bucket_mb * 2**20))
    plans = builder.plans()
    assert len(plans) == par.pp, "one plan per pipeline stage"
    return Iteration(cfg, model, topo, par, exchange, plans, builder.calls)


def _groups(it: Iteration) -> tuple[dict[str, list[int]], dict[str, np.ndarray]]:
    """Communicator groups (id -> ranks) and, per dimension, every rank's group id (step 5)."""
    dims = {c.dim for c in it.calls if c.op != "p2p" and c.steps}
    ids: dict[str, list[int]] = {}
    member: dict[str, np.ndarray] = {}
    for dim in _DIMS:
        rows = group_ranks(it.par, dim) if dim in dims else np.zeros((0, 0), dtype=int)
        if rows.shape[1] < 2:
            continue
        member[dim] = np.zeros(it.par.world, dtype=int)
        for row in rows:
            ids[str(len(ids) + 1)] = [int(r) for r in row]
            member[dim][row] = len(ids)
    return ids, member


def _work(it: Iteration, s: int) -> tuple[float, float]:
    """Forward FLOPs and bytes touched (weights, activations in and out) of stage ``s`` per
    micro-batch and rank: what ``num_ops`` and ``tensor_size`` split over its segments."""
    layers = stages(it.model, it.par.pp)[s]
    mb, par = it.par.batch / it.par.micro_batches, it.par
    flops = sum(layer.flops for layer in layers) * mb / par.tp
    touched = sum(layer.params + (layer.in_elems + layer.out_elems) * mb
                  for layer in layers) * par.bytes / par.tp
    return flops, touched


class _Rank:
    """The nodes of one rank's trace (steps 2 to 4), ids from 1 in emission order."""

    def __init__(self, it: Iteration, rank: int, groups: dict[str, list[int]],
                 member: dict[str, np.ndarray]) -> None:
        self.it, self.rank, self.groups, self.member = it, rank, groups, member
        self.nodes: list[TraceNode] = []

    def add(self, name: str, kind: int, deps: list[int], duration: int = 0,
            **attrs: Any) -> int:
        self.nodes.append(TraceNode(len(self.nodes) + 1, name, kind, tuple(deps), (),
                                    duration, attrs))
        return len(self.nodes)

    def collective(self, name: str, call: Call, deps: list[int]) -> int:
        par, comp = self.it.par, self.it.exchange.compression
        pg = int(self.member[call.dim][self.rank])
        size = call.nbytes
        if call.dim in ("dp", "dp-expert") and comp is not None:   # wire bytes (docstring)
            g = 1 if comp.summable else len(self.groups[str(pg)])
            size = comp.ratio * call.nbytes / par.bytes * 4 * g
        attrs: dict[str, Any] = {"is_cpu_op": False,
                                 "comm_type": COMM_TYPES.index(_OPS[call.op]),
                                 "comm_size": round(size), "pg_name": str(pg)}
        algorithm = call.algorithm.rpartition(": ")[2]
        if call.op == "allreduce" and algorithm.partition(":")[0] in ALLREDUCE:
            attrs["dlcomm_algorithm"] = algorithm
        return self.add(name, COLL, deps, **attrs)

    def compute(self, name: str, seg: Segment, share: tuple[float, float],
                deps: list[int]) -> list[int]:
        if seg.compute_s <= 0:
            return deps
        return [self.add(name, COMP, deps, round(seg.compute_s * 1e6), is_cpu_op=False,
                         num_ops=round(share[0] * seg.compute_s),
                         tensor_size=round(share[1] * seg.compute_s))]

    def p2p(self, kind: int, name: str, peer: int, tag: int, nbytes: float,
            deps: list[int]) -> int:
        src, dst = (self.rank, peer) if kind == SEND else (peer, self.rank)
        return self.add(name, kind, deps, comm_src=src, comm_dst=dst, comm_tag=tag,
                        comm_size=round(nbytes))

    def build(self) -> list[TraceNode]:
        it, par = self.it, self.it.par
        s = (self.rank // par.tp) % par.pp
        plan, m = it.plans[s], par.micro_batches
        flops, touched = _work(it, s)
        rates = {}
        for kind, segs, factor in (("F", plan.forward, 1.0), ("B", plan.backward,
                                                               BACKWARD_FACTOR)):
            total = sum(seg.compute_s for seg in segs)
            rates[kind] = (flops * factor / total, touched * factor / total) if total \
                else (0.0, 0.0)
        chain: list[int] = []
        sends: dict[str, list[int]] = {"F": [], "B": []}
        queues: dict[str, int] = {}
        order = stage_order(it.cfg.schedule, par.pp, s, m)
        for k, (kind, j) in enumerate(order):
            inbound = (it.plans[s - 1].send_forward if kind == "F" and s > 0 else
                       it.plans[s + 1].send_backward if kind == "B" and s + 1 < par.pp
                       else None)
            if inbound is not None:
                what, peer, tag = ("act", -par.tp, j) if kind == "F" else ("grad", par.tp, m + j)
                chain = chain + [self.p2p(RECV, f"recv {what} mb{j}", self.rank + peer, tag,
                                          inbound.nbytes, [])]
            for i, seg in enumerate(plan.forward if kind == "F" else plan.backward):
                chain = self.compute(f"{kind} mb{j} compute {i}", seg, rates[kind], chain)
                for b in seg.buckets if k == len(order) - 1 else ():
                    call = plan.buckets[b]
                    before = [queues[call.dim]] if call.dim in queues else []
                    queues[call.dim] = self.collective(f"{call.dim} bucket {b}", call,
                                                       chain + before)
                if seg.call is not None and seg.call.steps:
                    chain = [self.collective(f"{kind} mb{j} {seg.call.dim} {seg.call.op}",
                                             seg.call, chain)]
            send = plan.send_forward if kind == "F" else plan.send_backward
            if send is not None:
                peer = self.rank + (par.tp if kind == "F" else -par.tp)
                what = "act" if kind == "F" else "grad"
                sends[kind] = [self.p2p(SEND, f"send {what} mb{j}", peer,
                                        j if kind == "F" else m + j, send.nbytes,
                                        chain + sends[kind])]
        return self.nodes


def iteration_traces(it: Iteration, record: dict[str, Any] | None = None) -> TraceSet:
    """The trace set of ``it`` (steps 2 to 5); ``record`` joins the metadata's ``dlcomm``."""
    groups, member = _groups(it)
    ranks = [_Rank(it, r, groups, member).build() for r in range(it.par.world)]
    cfg = it.cfg
    about = {"config": cfg.to_dict(), "topology": it.topology.spec,
             "link": {"rate_gbps": cfg.link_rate_gbps, "ports": cfg.ports, "radix": cfg.radix},
             "parallelism": it.par.to_dict(), **(record or {})}
    return TraceSet(ranks, groups, {"generator": "dlcomm simulate",
                                    "dlcomm": json.dumps(about, sort_keys=True)})


def export_chakra(cfg: SimConfig, folder: str | Path, prefix: str = "dlcomm",
                  record: dict[str, Any] | None = None) -> list[Path]:
    """Write the iteration of ``cfg`` into the existing ``folder``: ``<prefix>.<rank>.et``
    and ``comm_group.json`` (use :func:`dlcomm.plan.simulate.chakra.publish` around it)."""
    return write_trace_set(Path(folder), iteration_traces(rebuild(cfg), record), prefix)


def export_runs(base: SimConfig, result: dict[str, Any], target: str | Path,
                say: Callable[[str], None] | None = None) -> Path:
    """Write the traces of every available run of a ``simulate`` result (``dlcomm simulate
    --chakra DIR``): one run into ``target`` itself, several into one subfolder each
    (``NN-<topology>-<exchange>-n<N>``); the run's resolved topology and parallelism
    rebuild exactly the configuration that was simulated."""
    runs = [r for r in result["runs"] if r.get("available")]
    if not runs:
        raise ConfigError("--chakra: no simulation ran (every exchange was unavailable)")

    def fill(folder: Path) -> None:
        for i, row in enumerate(runs):
            par = ",".join(f"{k}={v}" for k, v in row["parallelism"].items())
            cfg = replace(base, topology=row["spec"], accelerators=0, parallelism=par,
                          exchange=row["exchange"])
            name = re.sub(r"[^A-Za-z0-9.=-]+", "_", f"{i:02d}-{row['topology']}-"
                          f"{row['exchange']}-n{row['accelerators']}")
            where = folder if len(runs) == 1 else folder / name
            where.mkdir(exist_ok=True)
            export_chakra(cfg, where, record={"iteration_s": row["iteration_s"]})
            if say:
                say(f"Chakra traces of {row['topology_name']} {row['exchange_label']}: "
                    f"{row['accelerators']} ranks in {Path(target) / where.relative_to(folder)}")
    return publish(target, fill)
