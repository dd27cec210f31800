"""One training iteration of a catalog workload on a planner topology (``dlcomm simulate``).

Steps (each piece is shared with the rest of dlcomm):

1. Topology: ``dlcomm.plan.topology`` (``sized_spec`` to about N accelerators when the spec
   has no size); ranks DP x PP x TP placed by ``dlcomm.plan.commtime.place_ranks``.
2. Compute: ``dlcomm.workloads.catalog.iteration_time`` per layer (forward FLOPs / (peak x
   efficiency), backward 2x); per micro-batch of mb samples and per rank that is the
   per-sample time x mb / tp (Megatron splits every layer's work over the TP ranks); times
   K under a time dilation K (as the emulator waits them).
3. Stages: ``dlcomm.plan.traffic.stages`` (contiguous, about equal FLOPs).
4. Blocking communication inside compute, as ``dlcomm.plan.traffic`` counts it: per
   (column, row)-parallel layer pair an all-reduce of the row layer's output after it
   (forward) and of the column layer's input gradient after its backward; a
   vocabulary-parallel embedding all-reduces its output; MoE layers all-to-all their tokens
   before (dispatch) and after (combine) the expert MLP, both passes; sharded recommender
   embeddings all-to-all their pooled outputs after the last lookup and the gradients
   back before the lookups' backward.
5. Gradients: per stage, DDP buckets in backward order (``gradient_buckets``: 25 MiB,
   ``bytes`` per parameter of the parallelism, per-rank parameters: TP-split layers / tp),
   expert layers in their own buckets over dp/ep, sharded embeddings in none; each
   bucket's all-reduce through the exchange (``dlcomm.plan.simulate.collective``).
6. Pipeline transfers: the stage's last activation / tp per micro-batch, both ways.
   (Steps 2 to 6 as stage plans: ``dlcomm.plan.simulate.plans``.)
7. The event-driven schedule on the fluid network (``dlcomm.plan.simulate.schedule``); the
   result at real scale (/ K).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan.commtime import PLACEMENTS, place_ranks
from dlcomm.plan.simulate.collective import (
    Call,
    Collectives,
    ExchangeModel,
    measure_compression,
    parse_exchange,
)
from dlcomm.plan.simulate.fluid import SimNetwork
from dlcomm.plan.simulate.megatron_compute import gpt_layer_times
from dlcomm.plan.simulate.plans import StagePlanner, run_plans
from dlcomm.plan.simulate.schedule import SCHEDULES
from dlcomm.plan.topology import LinkParams, Topology, build_topology, sized_spec
from dlcomm.plan.traffic import Parallelism, iteration_traffic, parse_parallelism, stages
from dlcomm.registry import parse_spec
from dlcomm.workloads.accelerators import get_accelerator
from dlcomm.workloads.catalog import MODELS, ModelTable, get_model, iteration_time
from dlcomm.workloads.catalog.compute import DDP_BUCKET_CAP_BYTES
from dlcomm.workloads.catalog.transformer import CONFIGS
from dlcomm.workloads.kernels import KernelModel

COMPUTE_MODELS = ("flat", "kernels")

__all__ = ["SimConfig", "simulate", "resolve_parallelism", "build_topology_for"]


@dataclass(frozen=True)
class SimConfig:
    workload: str                          # catalog model
    topology: str = "fattree"              # planner spec; size options filled from N
    accelerators: int = 0                  # N (0: the spec's own size)
    parallelism: str = ""                  # dp=,pp=,tp=[,ep=,micro=,batch=,bytes=] or DxPxT
    exchange: str = "ring"                 # ring | switch | sparse-switch | auto | compressed:...
    compress: str | None = None            # compressor spec wrapping the exchange
    compress_ratio: float | None = None    # override the measured wire ratio
    compress_gbps: float = 100.0           # compression throughput, GB/s of float32 data
    density: float = 1.0                   # sparse exchanges: non-zero block fraction
    sparse_pattern: str = "shared"         # shared | independent
    accelerator: str = "v100"
    efficiency: float | None = None        # fraction of peak (default: the accelerator's)
    algorithm: str = "best"                # host-based all-reduce (best = fastest alone)
    placement: str = "linear"
    schedule: str = "1f1b"
    alpha_us: float = 1.0                  # per message latency
    hop_latency_us: float = 0.5            # per link on the route
    bucket_mb: float = DDP_BUCKET_CAP_BYTES / 2**20   # DDP bucket cap (MiB)
    dilation: float = 1.0                  # K: compute x K (links given already / K)
    link_rate_gbps: float = LinkParams().rate_gbps
    ports: int = LinkParams().ports
    radix: int = LinkParams().radix
    replicate_embeddings: bool = False     # recommenders: plain DP instead of sharding
    seed: int = 0
    calibration: dict[str, dict[str, float]] | None = None  # kind -> overhead_s, efficiency
    compute: str = "flat"                  # flat (FLOPs x efficiency) | kernels (GPT models)
    recompute: bool = False                # activation recomputation (forward again in backward)
    chunks: int = 1                        # model chunks per device (interleaved schedule)

    def __post_init__(self) -> None:
        MODELS.check(self.workload)
        get_accelerator(self.accelerator, self.efficiency)
        if self.accelerators < 0:
            raise ConfigError(f"--accelerators must be >= 2, got {self.accelerators}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"unknown placement {self.placement!r} "
                              f"(known: {', '.join(PLACEMENTS)})")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"unknown schedule {self.schedule!r} "
                              f"(known: {', '.join(SCHEDULES)})")
        if self.alpha_us < 0 or self.hop_latency_us < 0:
            raise ConfigError("--alpha-us and --hop-latency-us must be >= 0")
        if not self.bucket_mb > 0:
            raise ConfigError(f"--bucket-mb must be > 0, got {self.bucket_mb}")
        if not self.dilation >= 1:
            raise ConfigError(f"--dilation must be >= 1, got {self.dilation}")
        parse_exchange(self.exchange)
        if self.compute not in COMPUTE_MODELS:
            raise ConfigError(f"unknown --compute {self.compute!r} (known: "
                              f"{', '.join(COMPUTE_MODELS)})")
        if self.chunks < 1 or (self.chunks > 1) != (self.schedule == "interleaved"):
            raise ConfigError("--chunks V > 1 goes with --schedule interleaved (and only then)")

    @property
    def link_params(self) -> LinkParams:
        return LinkParams(self.link_rate_gbps, self.ports, self.radix)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_topology_for(cfg: SimConfig) -> Topology:
    """The planner topology of ``cfg`` (sized to ``accelerators`` if its spec has no size)."""
    spec = sized_spec(cfg.topology, cfg.accelerators, cfg.link_params) if cfg.accelerators \
        else cfg.topology
    return build_topology(spec, cfg.link_params)


def resolve_parallelism(text: str, model: ModelTable, accelerators: int,
                        replicate_embeddings: bool = False) -> Parallelism:
    """Parse ``text``; a missing dp fills the accelerators (N / (pp x tp))."""
    text = text.strip()
    given_dp = bool(text) and ("=" not in text or "dp" in parse_spec("p:" + text).options)
    par = parse_parallelism(text) if text else Parallelism()
    if not given_dp:
        dp = accelerators // (par.pp * par.tp)
        if dp < 1:
            raise ConfigError(f"pp x tp = {par.pp * par.tp} exceeds the {accelerators} "
                              "accelerators")
        par = replace(par, dp=dp)
    if model.family == "recommender" and not replicate_embeddings and (par.pp > 1 or par.tp > 1):
        raise ConfigError(f"{model.name} is a recommender: use dp only (its embeddings are "
                          "sharded over all ranks), or --replicate-embeddings")
    return par.resolved(model)


def _exchange_model(cfg: SimConfig, world_dp: int) -> ExchangeModel:
    kind, method = parse_exchange(cfg.exchange)
    if cfg.compress and method:
        raise ConfigError("give compression either in --exchange compressed:... or --compress")
    method = method or cfg.compress
    compression = None
    if method:
        compression = measure_compression(method, max(world_dp, 2), kind == "ring",
                                          cfg.compress_gbps, cfg.compress_ratio)
    cal = (cfg.calibration or {}).get(kind)
    return ExchangeModel(kind, cfg.density, cfg.sparse_pattern, compression,
                         float(cal["overhead_s"]) if cal else 0.0,
                         float(cal["efficiency"]) if cal else 1.0, cal is not None)


def simulate(cfg: SimConfig) -> dict[str, Any]:
    """Simulate one iteration of ``cfg``; returns the ``simulate`` result body (no envelope):
    ``summary``, ``stages``, ``collectives``, ``resolved``."""
    t0 = time.perf_counter()
    model = get_model(cfg.workload)
    topo = build_topology_for(cfg)
    n = cfg.accelerators or topo.accelerators
    par = resolve_parallelism(cfg.parallelism, model, min(n, topo.accelerators),
                              cfg.replicate_embeddings)
    acc = get_accelerator(cfg.accelerator, cfg.efficiency)
    sharded = model.family == "recommender" and not cfg.replicate_embeddings
    where = place_ranks(par, topo.accelerators, cfg.placement, cfg.seed)
    t_topo = time.perf_counter()
    net = SimNetwork(topo, where)
    t_net = time.perf_counter()
    exchange = _exchange_model(cfg, par.dp)
    coll = Collectives(net, par, exchange, cfg.algorithm, cfg.alpha_us * 1e-6,
                       cfg.hop_latency_us * 1e-6)
    fwd, bwd = _layer_times(cfg, model, acc, par)
    parts = None
    if cfg.chunks > 1:
        bounds = np.cumsum([0] + [len(p) for p in stages(model, par.pp * cfg.chunks)])
        parts = [(int(a), int(b)) for a, b in zip(bounds, bounds[1:])]
    builder = StagePlanner(model, par, coll, fwd, bwd, sharded,
                           int(cfg.bucket_mb * 2**20), parts=parts, recompute=cfg.recompute)
    plans = builder.plans()
    t_plan = time.perf_counter()
    timeline, pipeline = run_plans(net, builder, plans, par.micro_batches, cfg.schedule,
                                   cfg.chunks)
    t_sched = time.perf_counter()
    return _report(cfg, model, topo, par, net, exchange, builder.calls, timeline, pipeline,
                   {"topology_s": t_topo - t0, "network_s": t_net - t_topo,
                    "plan_s": t_plan - t_net, "schedule_s": t_sched - t_plan,
                    "total_s": t_sched - t0})


def _layer_times(cfg: SimConfig, model: ModelTable, acc: Any,
                 par: Parallelism) -> tuple[list[float], list[float]]:
    """Step 2: forward and backward seconds per layer, per micro-batch and rank (x K):
    ``flat`` from FLOPs at a fraction of peak, ``kernels`` kernel by kernel (GPT models:
    :mod:`.megatron_compute`); with ``recompute`` the backward runs the forward again."""
    mb = par.batch / par.micro_batches
    if cfg.compute == "kernels":
        tcfg = CONFIGS.get(model.name)
        if tcfg is None or tcfg.style != "gpt":
            gpts = ", ".join(n for n, c in CONFIGS.items() if c.style == "gpt")
            raise ConfigError(f"--compute kernels prices GPT models ({gpts}), not {model.name}")
        fwd, bwd = gpt_layer_times(tcfg, KernelModel(acc), mb, par.tp, cfg.recompute)
        return [t * cfg.dilation for t in fwd], [t * cfg.dilation for t in bwd]
    per_sample = iteration_time(model, acc, 1, cfg.efficiency)
    scale = mb / par.tp * cfg.dilation
    fwd = [t * scale for _, t in per_sample.forward]
    bwd = [t * scale for _, t in reversed(per_sample.backward)]   # forward order
    if cfg.recompute:
        bwd = [b + f for f, b in zip(fwd, bwd)]
    return fwd, bwd


def _report(cfg: SimConfig, model: ModelTable, topo: Topology, par: Parallelism,
            net: SimNetwork, exchange: ExchangeModel, calls: list[Call], timeline: Any,
            pipeline_s: float, timings: dict[str, float]) -> dict[str, Any]:
    k = cfg.dilation
    stages_out = [st.to_dict() for st in timeline.stages]
    for st in stages_out:
        for key in ("end_s", "compute_s", "idle_s", "gradient_tail_s"):
            st[key] /= k
        st["blocking_comm_s"] = {d: v / k for d, v in st["blocking_comm_s"].items()}
        st["comm_busy_s"] = {d: v / k for d, v in st["comm_busy_s"].items()}
    iteration = timeline.iteration_s / k
    compute = max(st["compute_s"] for st in stages_out)
    pipeline = pipeline_s / k
    exposed = max(iteration - pipeline, 0.0)
    m, p = par.micro_batches, par.pp
    collectives = _collectives(calls, net, m, k)
    busy: dict[str, float] = {}
    for st in stages_out:
        for d, v in st["comm_busy_s"].items():
            busy[d] = max(busy.get(d, 0.0), v)
    samples = par.dp * par.batch
    summary = {
        "iteration_s": iteration,
        "compute_s": compute,
        "pipeline_s": pipeline,
        "bubble_s": max(pipeline - compute, 0.0),
        "exposed_comm_s": exposed,
        "comm_share": exposed / iteration if iteration else 0.0,
        "comm_busy_s": busy,
        "bubble_fraction": (p - 1) / (m + p - 1),
        "samples_per_s": samples / iteration if iteration else 0.0,
        "critical_stage": int(np.argmax([st["end_s"] for st in stages_out])),
        "accelerators": par.world,
        "topology_accelerators": topo.accelerators,
        "exchange": exchange.label,
        "events": timeline.events,
        "rate_solves": timeline.rate_solves,
        "patterns": len(net.patterns),
        "simulate_s": timings["total_s"],
        "timings_s": timings,
    }
    if k != 1:
        summary["dilation"] = k
        summary["dilated_iteration_s"] = timeline.iteration_s
    resolved = {"workload": model.name, "family": model.family, "params": model.params,
                "topology": {"name": topo.name, "spec": topo.spec,
                             "accelerators": topo.accelerators,
                             "injection_gbps": topo.injection_gbps},
                "parallelism": par.to_dict(), "micro_batch": par.batch / m,
                "exchange": exchange.to_dict(),
                "traffic": [c.to_dict() for c in iteration_traffic(model, par)]
                if not (cfg.replicate_embeddings and model.family == "recommender") else []}
    return {"summary": summary, "stages": stages_out, "collectives": collectives,
            "resolved": resolved}


def _collectives(calls: list[Call], net: SimNetwork, micro: int,
                 dilation: float) -> list[dict[str, Any]]:
    """One row per kind of call: how often per iteration (all stages), alone how long, and
    the patterns of its first instance."""
    rows: dict[tuple[str, str, str, float], dict[str, Any]] = {}
    for c in calls:
        key = (c.dim, c.op, c.algorithm, round(c.nbytes, 3))
        per_iter = 1 if c.dim in ("dp", "dp-expert") else micro
        row = rows.get(key)
        if row is None:
            row = rows[key] = {
                "dim": c.dim, "op": c.op, "algorithm": c.algorithm, "nbytes": c.nbytes,
                "calls_per_iteration": 0, "stages": [], "alone_s": c.alone_s(net) / dilation,
                "patterns": [net.patterns[st.pattern].to_dict() | {"key": str(st.pattern)}
                             for st in c.steps]}
        row["calls_per_iteration"] += per_iter
        if c.stage not in row["stages"]:
            row["stages"].append(c.stage)
    return sorted(rows.values(), key=lambda r: (r["dim"], -r["nbytes"]))
