"""Calibration of the exchanges against microbenchmarks, apart from any validation case.

The simulator's network time of an all-reduce on an emulated star is the flow model's
(ring: 2(n-1)/n S / B; switch: S / B; ``dlcomm.simulate.collective``). Real exchanges
add costs the flow model does not know: gloo's chunking and copies, the software switch's
per-round processing, Python and kernel overheads. One ``dlcomm bench allreduce`` per
message size (each exchange of the list in the same run, on the same emulated star)
measures them; the fit is

    measured(S) = overhead + efficiency x modelled(S)

by least squares on relative residuals over the sizes (overhead >= 0), per exchange: every
size counts alike, whatever its time. The default sizes (4, 26 and 52 MB) span the
collectives of the iterations it is meant for (DDP's first small bucket, its 25 MiB
buckets, two of them); the fit extrapolates beyond them. The validation then predicts
emulated iterations with these two constants, which never saw an iteration.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan.topology import build_topology
from dlcomm.plan.traffic import Parallelism
from dlcomm.simulate.collective import Collectives, ExchangeModel
from dlcomm.simulate.network import SimNetwork

__all__ = ["CalibrationConfig", "star_spec", "modelled_allreduce_s", "fit", "calibrate"]


@dataclass(frozen=True)
class CalibrationConfig:
    workers: int
    link_bps: float                              # emulated link rate (already / K)
    exchanges: tuple[str, ...] = ("ring", "switch")
    sizes: tuple[int, ...] = (4_000_000, 26_000_000, 52_000_000)
    reps: int = 3
    warmup: int = 1

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ConfigError(f"calibration needs >= 2 workers, got {self.workers}")
        if len(self.sizes) < 2:
            raise ConfigError("calibration needs at least two message sizes")


def star_spec(workers: int, link_bps: float) -> str:
    """The planner's one-switch fat tree: a star of ``workers`` links of ``link_bps``
    with an aggregating switch (the emulated star of ``dlcomm emulate``)."""
    return f"fattree:n={workers},ports=1,rate={link_bps / 1e9:.9g},ina=1"


def modelled_allreduce_s(kind: str, workers: int, nbytes: float, link_bps: float) -> float:
    """The flow model's time of one all-reduce of ``nbytes`` through ``kind`` on the star,
    with no latency (what calibration scales)."""
    topo = build_topology(star_spec(workers, link_bps))
    net = SimNetwork(topo, np.arange(workers))
    coll = Collectives(net, Parallelism(dp=workers, bytes=4), ExchangeModel(kind),
                       "ring", 0.0, 0.0)
    return coll.gradients("dp", 0, nbytes).alone_s(net)


def fit(modelled: Sequence[float], measured: Sequence[float]) -> tuple[float, float]:
    """(overhead, efficiency) of measured = overhead + efficiency x modelled, overhead >= 0,
    minimising the squared relative residuals (residual / measured)."""
    x, y = np.asarray(modelled, float), np.asarray(measured, float)
    w = 1.0 / y
    design = np.column_stack([w, x * w])
    (a, c), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    if a < 0:
        xr = x * w
        a, c = 0.0, float(xr.sum() / (xr @ xr))
    return float(a), float(c)


def calibrate(cfg: CalibrationConfig, say: Callable[[str], None] | None = None
              ) -> dict[str, Any]:
    """Run the microbenchmarks (root: emulated network) and fit every exchange."""
    from dlcomm.bench.allreduce import AllreduceBench
    from dlcomm.bench.run import run_allreduce
    from dlcomm.emulate.network import NetworkOptions

    start = time.perf_counter()
    net = NetworkOptions("emulated", f"{cfg.link_bps:.0f}bit", "star")
    points: dict[str, list[dict[str, float]]] = {ex: [] for ex in cfg.exchanges}
    for size in cfg.sizes:
        bench = AllreduceBench(tuple(cfg.exchanges), cfg.workers, size, cfg.reps, cfg.warmup)
        result = run_allreduce(bench, net)
        for row in result["results"]:
            model = modelled_allreduce_s(row["exchange"], cfg.workers, size, cfg.link_bps)
            points[row["exchange"]].append({"size_bytes": size, "measured_s": row["time_s"],
                                            "modelled_s": model, "times_s": row["times_s"]})
            if say:
                say(f"calibration n={cfg.workers} {row['exchange']} {size / 1e6:.0f} MB: "
                    f"{row['time_s']:.3f} s measured, {model:.3f} s modelled")
    fits = {}
    for ex, pts in points.items():
        a, c = fit([p["modelled_s"] for p in pts], [p["measured_s"] for p in pts])
        worst = max(abs(a + c * p["modelled_s"] - p["measured_s"]) / p["measured_s"]
                    for p in pts)
        fits[ex] = {"overhead_s": a, "efficiency": c, "fit_max_rel_error": worst,
                    "points": pts}
    return {"config": asdict(cfg), "exchanges": fits,
            "wall_time_s": time.perf_counter() - start}
