"""Calibration of the exchanges against microbenchmarks, apart from any validation case.

The simulator's network time of an all-reduce on an emulated star is the flow model's
(ring: 2(n-1)/n S / B; switch: S / B; ``dlcomm.plan.simulate.collective``). Real exchanges
add costs the flow model does not know: gloo's chunking and copies, the software switch's
per-round processing, Python and kernel overheads. They are measured per message size S
(each exchange of the list in the same run, on the same emulated star), in one of two
ways:

- ``stream`` (default): the emulator runs iterations without a model and without compute
  (``EmulateConfig.stream``): a few buckets of S bytes handed over at once and all-reduced
  back to back, as DDP's buckets are once backward has produced them; the time per bucket
  is the stream's time / its buckets. This is the regime the simulator predicts: a worker
  that finished one bucket starts the next while others still receive the last result,
  which isolated all-reduces never show (8 workers on this machine: about 15% less time
  per byte in a stream);
- ``isolated``: one ``dlcomm bench allreduce`` per size, each all-reduce alone.

The fit is

    measured(S) = overhead + efficiency x modelled(S)

by least squares on relative residuals over the sizes (overhead >= 0), per exchange: every
size counts alike, whatever its time. The default sizes (4, 26 and 52 MB) span the
collectives of the iterations it is meant for (DDP's first small bucket, its 25 MiB
buckets, two of them); the fit extrapolates beyond them. The validation then predicts
emulated iterations with these two constants, which never saw a model's iteration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.calibration import fit, modelled_allreduce_s

__all__ = ["CalibrationConfig", "calibrate", "stream_buckets"]


@dataclass(frozen=True)
class CalibrationConfig:
    workers: int
    link_bps: float                              # emulated link rate (already / K)
    exchanges: tuple[str, ...] = ("ring", "switch")
    sizes: tuple[int, ...] = (4_000_000, 26_000_000, 52_000_000)
    reps: int = 3
    warmup: int = 1
    mode: str = "stream"                         # or "isolated"
    stream_bytes: int = 100_000_000              # stream mode: about this much per stream

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ConfigError(f"calibration needs >= 2 workers, got {self.workers}")
        if len(self.sizes) < 2:
            raise ConfigError("calibration needs at least two message sizes")
        if self.mode not in ("stream", "isolated"):
            raise ConfigError(f"calibration mode must be stream or isolated, not {self.mode!r}")


def stream_buckets(cfg: CalibrationConfig, size: int) -> int:
    """Buckets of ``size`` bytes in one calibration stream (at least 2)."""
    return max(2, round(cfg.stream_bytes / size))


def _measure(cfg: CalibrationConfig, size: int) -> list[dict[str, Any]]:
    """Per exchange: (seconds per all-reduce of ``size`` bytes, the repetitions' times)."""
    if cfg.mode == "isolated":
        from dlcomm.bench.allreduce import AllreduceBench
        from dlcomm.bench.run import run_allreduce
        from dlcomm.emulate.placement import NetworkOptions

        net = NetworkOptions("emulated", f"{cfg.link_bps:.0f}bit", "star")
        bench = AllreduceBench(tuple(cfg.exchanges), cfg.workers, size, cfg.reps, cfg.warmup)
        return [{"exchange": r["exchange"], "time_s": r["time_s"], "times_s": r["times_s"]}
                for r in run_allreduce(bench, net)["results"]]
    from dlcomm.emulate.dilation import EmulateConfig
    from dlcomm.emulate.emulation import run_emulation

    count = stream_buckets(cfg, size)
    emu = EmulateConfig("stream", cfg.workers, cfg.link_bps, iterations=cfg.reps,
                        warmup=cfg.warmup, stream=(max(1, size // 4),) * count,
                        exchange=cfg.exchanges[0])
    result = run_emulation(emu, exchanges=list(cfg.exchanges))
    return [{"exchange": r["exchange"], "time_s": r["iteration_time_s"] / count,
             "times_s": [t / count for t in r["measured_iterations_s"]], "buckets": count}
            for r in result["results"]]


def calibrate(cfg: CalibrationConfig, say: Callable[[str], None] | None = None
              ) -> dict[str, Any]:
    """Run the microbenchmarks (root: emulated network) and fit every exchange."""
    start = time.perf_counter()
    points: dict[str, list[dict[str, float]]] = {ex: [] for ex in cfg.exchanges}
    for size in cfg.sizes:
        for row in _measure(cfg, size):
            model = modelled_allreduce_s(row["exchange"], cfg.workers, size, cfg.link_bps)
            points[row["exchange"]].append({"size_bytes": size, "measured_s": row["time_s"],
                                            "modelled_s": model, "times_s": row["times_s"],
                                            **({"buckets": row["buckets"]}
                                               if "buckets" in row else {})})
            if say:
                say(f"calibration n={cfg.workers} {row['exchange']} {size / 1e6:.0f} MB "
                    f"({cfg.mode}): {row['time_s']:.3f} s measured, {model:.3f} s modelled")
    fits = {}
    for ex, pts in points.items():
        a, c = fit([p["modelled_s"] for p in pts], [p["measured_s"] for p in pts])
        worst = max(abs(a + c * p["modelled_s"] - p["measured_s"]) / p["measured_s"]
                    for p in pts)
        fits[ex] = {"overhead_s": a, "efficiency": c, "fit_max_rel_error": worst,
                    "points": pts}
    return {"config": asdict(cfg), "exchanges": fits,
            "wall_time_s": time.perf_counter() - start}
