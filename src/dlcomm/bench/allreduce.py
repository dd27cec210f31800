"""``dlcomm bench allreduce``: time all-reduces of real tensors through each exchange.

Every worker holds a float32 tensor drawn from ``--seed`` and its rank. For each exchange
(in the same run, so that ratios compare like with like): one warm-up, then ``reps``
timed all-reduces, each started after a barrier; the time of a repetition is the slowest
worker's. Rank 0 rebuilds every worker's input, sums them in float64 and reports the
largest absolute error and a SHA-256 of the result's bytes, so lossy and lossless runs, or
two exchanges, can be compared bit for bit. On the emulated network each worker also reads
its interface counters around every repetition (true wire bytes).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dlcomm.errors import ConfigError
from dlcomm.exchange import EXCHANGES, Exchange, ExchangeContext, make_exchange
from dlcomm.registry import parse_spec
from dlcomm.runtime.env import WorkerEnv, process_group, set_threads, wire_bytes

__all__ = ["AllreduceBench", "make_input", "reference_sum", "worker_main", "summarize"]


@dataclass(frozen=True)
class AllreduceBench:
    exchanges: tuple[str, ...]        # exchange specs, measured in this order
    workers: int
    size_bytes: int                   # per worker, float32
    reps: int = 5
    warmup: int = 1
    seed: int = 0
    timeout_s: float = 300.0
    result_path: str = ""             # where rank 0 writes its measurements
    job_name: str = "bench"
    exchange_options: dict[str, str] = field(default_factory=dict)  # applied to every exchange
    density: float = 1.0              # fraction of non-zero blocks (or elements)
    pattern: str = "shared"           # shared | independent | elementwise
    block: int = 256                  # block size of the sparsity pattern
    checksum_reps: bool = False       # every worker hashes every repetition's result
    interleave: bool = False          # exchanges take turns, repetition by repetition

    def __post_init__(self) -> None:
        if not self.exchanges:
            raise ConfigError("--exchange needs at least one exchange")
        for spec in self.exchanges:
            EXCHANGES.check(spec)
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.size_bytes < 4 or self.size_bytes % 4:
            raise ConfigError("--size must be a positive multiple of 4 bytes, got "
                              f"{self.size_bytes}")
        if self.reps < 1 or self.warmup < 0:
            raise ConfigError("--reps must be >= 1 and --warmup >= 0")
        if not 0 <= self.density <= 1:
            raise ConfigError(f"--density must be in [0, 1], got {self.density}")
        if self.pattern not in PATTERNS:
            raise ConfigError(f"--pattern must be one of {', '.join(PATTERNS)}, "
                              f"got {self.pattern!r}")
        if self.block < 1:
            raise ConfigError(f"--block must be >= 1, got {self.block}")
        if not 0 < self.timeout_s < float("inf"):
            raise ConfigError(f"--timeout-s must be a finite number > 0, got {self.timeout_s}")

    @property
    def numel(self) -> int:
        return self.size_bytes // 4


PATTERNS = ("shared", "independent", "elementwise")


def make_input(seed: int, rank: int, numel: int, density: float = 1.0,
               pattern: str = "shared", block: int = 256) -> torch.Tensor:
    """Worker ``rank``'s input, reproducible from (seed, rank): standard normal float32 where
    non-zero. With ``density`` < 1: ``shared`` keeps the same randomly chosen fraction of
    blocks on every worker (as embedding rows that every worker touched), ``independent``
    draws each worker's blocks on its own, ``elementwise`` zeroes elements independently."""
    gen = torch.Generator().manual_seed(seed * 100_003 + rank)
    x = torch.randn(numel, generator=gen)
    if density >= 1.0:
        return x
    zero = torch.zeros(())
    if pattern == "elementwise":
        keep = torch.rand(numel, generator=gen) < density
        return torch.where(keep, x, zero)
    blocks = -(-numel // block)
    stream = rank if pattern == "independent" else 99_991
    pick = torch.Generator().manual_seed(seed * 100_003 + stream)
    keep_blocks = torch.rand(blocks, generator=pick) < density
    return torch.where(keep_blocks.repeat_interleave(block)[:numel], x, zero)


def reference_sum(seed: int, world: int, numel: int, density: float = 1.0,
                  pattern: str = "shared", block: int = 256) -> torch.Tensor:
    """The float64 sum of every worker's input."""
    total = torch.zeros(numel, dtype=torch.float64)
    for rank in range(world):
        total += make_input(seed, rank, numel, density, pattern, block)
    return total


def _with_options(spec: str, options: dict[str, str]) -> str:
    if not options:
        return spec
    parsed = parse_spec(spec)
    return str(type(parsed)(parsed.name, {**options, **parsed.options}))


def _open(cfg: AllreduceBench, env: WorkerEnv, spec: str) -> Any:
    return make_exchange(_with_options(spec, cfg.exchange_options),
                         ExchangeContext(env.rank, env.world_size, job_name=cfg.job_name))


def _one_rep(cfg: AllreduceBench, exchange: Any, x: torch.Tensor
             ) -> tuple[dict[str, Any], torch.Tensor]:
    """One all-reduce of a copy of ``x``, started after a barrier: its time, CPU, wire."""
    buf = x.clone()
    dist.barrier()
    w0, c0, t0 = wire_bytes(), time.process_time(), time.perf_counter()
    out = exchange.allreduce(buf).wait()
    t1, c1 = time.perf_counter(), time.process_time()
    dist.barrier()  # a worker finishes before its last sends drain; count them too
    w1 = wire_bytes()
    rep: dict[str, Any] = {"time_s": t1 - t0, "cpu_s": c1 - c0}
    if w0 and w1:
        rep.update({k: w1[k] - w0[k] for k in w1})
    if cfg.checksum_reps:
        rep["checksum"] = hashlib.sha256(out.contiguous().numpy().tobytes()).hexdigest()
    return rep, out


def _warmup(cfg: AllreduceBench, exchanges: list[Exchange]) -> int:
    """``--warmup`` repetitions, and as many more as an exchange runs otherwise at its start
    (PowerSGD's uncompressed start; every exchange alike when they take turns)."""
    return cfg.warmup + max(ex.warmup_iterations for ex in exchanges)


def _measure_all(cfg: AllreduceBench, env: WorkerEnv, x: torch.Tensor
                 ) -> Iterator[tuple[list[dict[str, Any]], torch.Tensor, dict[str, Any]]]:
    """Every exchange's repetitions, its last result and its stats, exchange by exchange:
    one exchange after another (each result is yielded, and can be freed, before the next
    exchange starts), or (``interleave``) all exchanges open at once and taking turns,
    repetition by repetition, so that a machine whose speed drifts slows every variant
    alike."""
    if not cfg.interleave:
        for spec in cfg.exchanges:
            exchange = _open(cfg, env, spec)
            try:
                reps, result = [], x
                warmup = _warmup(cfg, [exchange])
                for i in range(warmup + cfg.reps):
                    rep, result = _one_rep(cfg, exchange, x)   # only the last result is kept
                    if i >= warmup:
                        reps.append(rep)
                stats = exchange.stats().as_dict()
            finally:
                exchange.close()
            yield reps, result, stats
            del result
        return
    exchanges = []
    try:
        for spec in cfg.exchanges:
            exchanges.append(_open(cfg, env, spec))
        runs: list[list[dict[str, Any]]] = [[] for _ in exchanges]
        last: list[torch.Tensor] = [x] * len(exchanges)
        warmup = _warmup(cfg, exchanges)
        for i in range(warmup + cfg.reps):
            for j, exchange in enumerate(exchanges):
                rep, last[j] = _one_rep(cfg, exchange, x)
                if i >= warmup:
                    runs[j].append(rep)
        stats = [ex.stats().as_dict() for ex in exchanges]
    finally:
        for exchange in exchanges:
            exchange.close()
    for j in range(len(exchanges)):
        yield runs[j], last[j], stats[j]


def worker_main(config: dict[str, Any]) -> None:
    """One rank of the benchmark (run by ``dlcomm run-job bench-allreduce``)."""
    cfg = AllreduceBench(**{**config, "exchanges": tuple(config["exchanges"])})
    env = WorkerEnv.from_environ()
    set_threads(env.threads(0))
    with process_group(env, cfg.timeout_s):
        sparsity = (cfg.density, cfg.pattern, cfg.block)
        x = make_input(cfg.seed, env.rank, cfg.numel, *sparsity)
        reference = (reference_sum(cfg.seed, env.world_size, cfg.numel, *sparsity)
                     if env.rank == 0 else None)
        measured = []
        for spec, (reps, out, stats) in zip(cfg.exchanges, _measure_all(cfg, env, x)):
            gathered: list[Any] = [None] * env.world_size
            dist.gather_object({"reps": reps, "stats": stats},
                               gathered if env.rank == 0 else None, dst=0)
            if env.rank == 0:
                assert reference is not None
                measured.append({
                    "exchange": spec, "per_worker": gathered,
                    "max_abs_error": float((out.double() - reference).abs().max()),
                    "checksum": hashlib.sha256(out.contiguous().numpy().tobytes()).hexdigest(),
                    "finite": bool(torch.isfinite(out).all())})
            del out   # free this exchange's result before the next one runs
        if env.rank == 0:
            Path(cfg.result_path).write_text(json.dumps({"measured": measured,
                                                         "reference_max_abs": float(
                                                             reference.abs().max())}))


def summarize(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per exchange: the slowest worker's time per repetition, their median, traffic, CPU."""
    rows = []
    for entry in raw["measured"]:
        workers = entry["per_worker"]
        reps = len(workers[0]["reps"])
        times = [max(w["reps"][i]["time_s"] for w in workers) for i in range(reps)]
        cpu = [sum(w["reps"][i]["cpu_s"] for w in workers) for i in range(reps)]
        row = {"exchange": entry["exchange"], "time_s": statistics.median(times),
               "times_s": times, "cpu_s_per_rep": statistics.median(cpu),
               "max_abs_error": entry["max_abs_error"], "checksum": entry["checksum"],
               "finite": entry["finite"],
               "exchange_stats": [w["stats"] for w in workers]}
        if "tx_bytes" in workers[0]["reps"][0]:
            row["wire_bytes_per_host"] = [
                {k: statistics.median(r[k] for r in w["reps"]) for k in ("tx_bytes", "rx_bytes")}
                for w in workers]
        rows.append(row)
    return rows


def bench_config_dict(cfg: AllreduceBench) -> dict[str, Any]:
    d = asdict(cfg)
    d["exchanges"] = list(cfg.exchanges)
    return d
