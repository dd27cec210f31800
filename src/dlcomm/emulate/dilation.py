"""Time-dilated emulation of a big model's training iteration (``dlcomm emulate``).

Workers do not compute. Per iteration each worker (time dilation; docs/references.md:
simulation and emulation):

1. waits the model's forward time x K;
2. walks backward in DDP's bucket order: waits until bucket b's gradients would be ready
   (its backward time x K) and starts an all-reduce of a real tensor of the bucket's size
   (gradient-like values, keyed by the bucket index as DDP does) through the chosen
   exchange, asynchronously, so communication overlaps the remaining backward computation
   exactly as DDP overlaps it;
3. waits the rest of backward, then for every all-reduce to finish.

Links run at bandwidth / K, so the compute/communication ratio of the real cluster is
kept and the measured iteration time / K is the real-scale iteration time. K is chosen from
the machine's measured network capacity unless given.
"""

from __future__ import annotations

import json
import math
import resource
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dlcomm.errors import ConfigError
from dlcomm.exchange import EXCHANGES, ExchangeContext, make_exchange
from dlcomm.runtime.env import WorkerEnv, process_group, set_threads, wire_bytes
from dlcomm.workloads.accelerators import get_accelerator
from dlcomm.workloads.catalog import get_model
from dlcomm.workloads.catalog.compute import (
    DDP_BUCKET_CAP_BYTES,
    IterationTime,
    iteration_time,
    model_buckets,
)

__all__ = ["EmulateConfig", "Schedule", "schedule_for", "worker_main", "intervals_union",
           "nice_dilation", "breakdown"]


@dataclass(frozen=True)
class EmulateConfig:
    workload: str                    # catalog model, e.g. "resnet50"
    workers: int
    bandwidth_bps: float             # real-scale link rate
    accelerator: str = "v100"
    batch: int | None = None         # per accelerator; default: the model's
    efficiency: float | None = None  # fraction of peak; default: the accelerator's
    measured_iteration_s: float | None = None  # replaces the compute estimate
    dilation: float = 1.0            # K
    exchange: str = "ring"
    iterations: int = 3              # measured iterations
    warmup: int = 1
    bucket_cap_bytes: int = DDP_BUCKET_CAP_BYTES
    timeout_s: float = 600.0
    result_path: str = ""
    job_name: str = "emulate"
    stream: tuple[int, ...] = ()     # if set: no model, no compute, buckets of these many
    # elements all handed over at once (a stream of back-to-back all-reduces: calibration)

    def __post_init__(self) -> None:
        if not self.stream:
            get_model(self.workload)
        get_accelerator(self.accelerator, self.efficiency)
        EXCHANGES.check(self.exchange)
        if self.workers < 1 or self.iterations < 1 or self.warmup < 0:
            raise ConfigError("--workers and --iterations must be >= 1, --warmup >= 0")
        if not self.dilation >= 1:
            raise ConfigError(f"--dilation must be >= 1, got {self.dilation}")
        if self.batch is not None and self.batch < 1:
            raise ConfigError(f"--batch must be >= 1, got {self.batch}")
        if any(n < 1 for n in self.stream):
            raise ConfigError(f"stream buckets must hold >= 1 element, got {self.stream}")


@dataclass(frozen=True)
class Schedule:
    """One iteration at real scale: forward, backward, and when each bucket is ready."""

    timing: IterationTime
    bucket_numel: tuple[int, ...]
    bucket_ready_s: tuple[float, ...]   # after backward starts

    @property
    def gradient_bytes(self) -> int:
        return 4 * sum(self.bucket_numel)


def schedule_for(cfg: EmulateConfig) -> Schedule:
    if cfg.stream:
        idle = IterationTime("stream", cfg.accelerator, 1, 1.0, (), ())
        return Schedule(idle, tuple(cfg.stream), (0.0,) * len(cfg.stream))
    model = get_model(cfg.workload)
    acc = get_accelerator(cfg.accelerator, cfg.efficiency)
    timing = iteration_time(model, acc, cfg.batch or model.default_batch, cfg.efficiency,
                            cfg.measured_iteration_s)
    buckets = model_buckets(model, timing, cap_bytes=cfg.bucket_cap_bytes)
    return Schedule(timing, tuple(b.params for b in buckets), tuple(b.ready_s for b in buckets))


def intervals_union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def nice_dilation(minimum: float) -> float:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is >= ``minimum``."""
    if minimum <= 1:
        return 1.0
    k = 10 ** math.floor(math.log10(minimum))
    for step in (1, 2, 5, 10):
        if step * k >= minimum - 1e-9:
            return float(step * k)
    return float(10 * k)


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(left, 0.05))


def _one_iteration(sched: Schedule, k: float, exchange: Any, buffers: list[torch.Tensor]
                   ) -> dict[str, Any]:
    timing = sched.timing
    lock = threading.Lock()
    done: dict[int, float] = {}
    starts: dict[int, float] = {}
    t0 = time.perf_counter()
    _sleep_until(t0 + timing.forward_s * k)
    t_bwd = time.perf_counter()
    futures = []
    for i, (buf, ready) in enumerate(zip(buffers, sched.bucket_ready_s)):
        _sleep_until(t_bwd + ready * k)
        starts[i] = time.perf_counter()

        def finished(fut: Any, i: int = i) -> None:
            with lock:
                done[i] = time.perf_counter()

        fut = exchange.allreduce(buf, i)  # the bucket index is its key, as in DDP
        fut.add_done_callback(finished)
        futures.append(fut)
    _sleep_until(t_bwd + timing.backward_s * k)
    t_compute_end = time.perf_counter()
    for fut in futures:
        fut.wait()
    t1 = time.perf_counter()
    with lock:
        intervals = [(starts[i], done.get(i, t1)) for i in starts]
    return {"iteration_s": t1 - t0, "compute_s": t_compute_end - t0,
            "comm_busy_s": intervals_union(intervals),
            "tail_s": t1 - t_compute_end}


def gradient_buffers(numels: Sequence[int], rank: int) -> list[torch.Tensor]:
    """One buffer per bucket, filled like gradients (normal values, different per rank):
    an exchange's cost may depend on the values (quantization exponents, compression,
    sparsity), so zeros would flatter it."""
    gen = torch.Generator().manual_seed(1_000_003 + rank)
    return [torch.randn(n, generator=gen).mul_(1e-3) for n in numels]


def worker_main(config: dict[str, Any]) -> None:
    """One rank of the emulation (run by ``dlcomm run-job emulate``)."""
    cfg = EmulateConfig(**config)
    env = WorkerEnv.from_environ()
    set_threads(env.threads(0))
    sched = schedule_for(cfg)
    with process_group(env, cfg.timeout_s):
        exchange = make_exchange(cfg.exchange, ExchangeContext(env.rank, env.world_size,
                                                               job_name=cfg.job_name))
        buffers = gradient_buffers(sched.bucket_numel, env.rank)
        records = []
        warmup = cfg.warmup + exchange.warmup_iterations  # past PowerSGD's uncompressed start
        try:
            for i in range(warmup + cfg.iterations):
                if i:
                    for buf in buffers:  # the sums become the next averages, as in DDP
                        buf.div_(env.world_size)
                dist.barrier()
                w0, c0 = wire_bytes(), time.process_time()
                rec = _one_iteration(sched, cfg.dilation, exchange, buffers)
                w1, c1 = wire_bytes(), time.process_time()
                rec["cpu_s"] = c1 - c0
                if w0 and w1:
                    rec.update({key: w1[key] - w0[key] for key in w1})
                if i >= warmup:
                    records.append(rec)
            stats = exchange.stats().as_dict()
        finally:
            exchange.close()
        mine = {"records": records, "stats": stats, "warmup": warmup,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        gathered: list[Any] = [None] * env.world_size
        dist.gather_object(mine, gathered if env.rank == 0 else None, dst=0)
        if env.rank == 0:
            Path(cfg.result_path).write_text(json.dumps(gathered))


def breakdown(cfg: EmulateConfig, sched: Schedule, gathered: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """Real-scale summary from every worker's dilated measurements (slowest worker counts)."""
    k = cfg.dilation
    n_iter = len(gathered[0]["records"])
    per_iter = [max(w["records"][i]["iteration_s"] for w in gathered) for i in range(n_iter)]
    busy = [max(w["records"][i]["comm_busy_s"] for w in gathered) for i in range(n_iter)]
    cpu = [sum(w["records"][i]["cpu_s"] for w in gathered) for i in range(n_iter)]
    measured = statistics.median(per_iter)
    iteration = measured / k
    compute = sched.timing.iteration_s
    comm = statistics.median(busy) / k
    exposed = max(iteration - compute, 0.0)
    summary = {
        "iteration_time_s": iteration,
        "compute_s": compute, "forward_s": sched.timing.forward_s,
        "backward_s": sched.timing.backward_s,
        "comm_busy_s": comm, "exposed_comm_s": exposed, "overlap_s": max(comm - exposed, 0.0),
        "comm_share": exposed / iteration if iteration else 0.0,
        "measured_iteration_s": measured, "measured_iterations_s": per_iter,
        "dilation": k, "buckets": len(sched.bucket_numel),
        "warmup_iterations": gathered[0]["warmup"],
        "gradient_bytes": sched.gradient_bytes,
        "emulation": {"wall_s_per_iteration": measured,
                      "cpu_s_per_iteration": statistics.median(cpu),
                      "peak_rss_bytes_per_worker": max(w["peak_rss_bytes"] for w in gathered),
                      "link_rate_bps": cfg.bandwidth_bps / k},
        "real_cluster": {"accelerators": cfg.workers, "accelerator": cfg.accelerator,
                         "accelerator_s_per_iteration": cfg.workers * iteration,
                         "link_rate_bps": cfg.bandwidth_bps,
                         "gradient_bytes_per_accelerator": sched.gradient_bytes},
    }
    if "tx_bytes" in gathered[0]["records"][0]:
        summary["wire_bytes_per_host"] = [
            {key: statistics.median(r[key] for r in w["records"])
             for key in ("tx_bytes", "rx_bytes")}
            for w in gathered]
    return summary


def config_dict(cfg: EmulateConfig) -> dict[str, Any]:
    return asdict(cfg)
