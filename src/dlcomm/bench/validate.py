"""``dlcomm simulate validate``: the simulator against the emulator where both can run.

For each number of workers n (default 4 and 8) with its time dilation K (10 and 20, so
that n links at 10 Gbit/s / K fit this machine, docs/emulation.md):

1. calibrate ring and switch on the emulated star at 10 Gbit/s / K at three message
   sizes (``dlcomm.bench.calibrate``; by default streams of back-to-back buckets with
   no model and no compute, or isolated ``dlcomm bench allreduce`` calls): no model's
   iteration is seen;
2. emulate each workload (resnet50, vgg19, bert-base by default) with every exchange on
   one emulated star (``dlcomm.emulate.emulation.run_emulation``: compute waited x K,
   buckets all-reduced FIFO as DDP does, links at bandwidth / K; iteration / K);
3. simulate the same: the planner's one-switch fat tree with n links of bandwidth / K
   (``calibrate.star_spec``), data parallelism over n with float32 gradients and the
   emulator's 25 MiB buckets, compute x K, no latency (the emulated links have none), the
   calibrated exchange constants, result / K;
4. error = simulated / measured - 1, per case; also the prediction with the ideal flow
   model (no calibration) for context. The machine's 1-minute load average before each
   calibration and emulation is recorded: the software switch shares this machine's
   cores with whatever else runs, so its speed, and both measurements, depend on it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from dlcomm.bench.calibrate import CalibrationConfig, calibrate
from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.calibration import star_spec
from dlcomm.plan.simulate.iteration import SimConfig, simulate
from dlcomm.results import new_result

__all__ = ["ValidateConfig", "validate", "TOLERANCE"]

TOLERANCE = 0.10


@dataclass(frozen=True)
class ValidateConfig:
    workloads: tuple[str, ...] = ("resnet50", "vgg19", "bert-base")
    workers: tuple[int, ...] = (4, 8)
    dilations: tuple[float, ...] = (10.0, 20.0)        # K per entry of ``workers``
    exchanges: tuple[str, ...] = ("ring", "switch")
    bandwidth_bps: float = 10e9
    accelerator: str = "v100"
    iterations: int = 2
    warmup: int = 1
    sizes: tuple[int, ...] = (4_000_000, 26_000_000, 52_000_000)
    reps: int = 3
    calibration: str = "stream"                        # or "isolated"

    def __post_init__(self) -> None:
        if len(self.workers) != len(self.dilations):
            raise ConfigError("give one dilation per worker count")
        if any(n < 2 for n in self.workers) or any(k < 1 for k in self.dilations):
            raise ConfigError("workers must be >= 2 and dilations >= 1")
        for ex in self.exchanges:
            if ex not in ("ring", "switch"):
                raise ConfigError(f"validation compares ring and switch, not {ex!r}")
        for w in self.workloads:
            SimConfig(w)


def _simulate(cfg: ValidateConfig, workload: str, n: int, k: float, exchange: str,
              calibration: dict[str, dict[str, float]] | None) -> dict[str, Any]:
    sim = SimConfig(workload, star_spec(n, cfg.bandwidth_bps / k), 0,
                    f"dp={n},bytes=4,micro=1", exchange, accelerator=cfg.accelerator,
                    algorithm="ring", alpha_us=0.0, hop_latency_us=0.0, dilation=k,
                    calibration=calibration)
    return simulate(sim)["summary"]


def validate(cfg: ValidateConfig, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run calibration, emulation and simulation (module docstring); needs root."""
    from dlcomm.emulate.dilation import EmulateConfig
    from dlcomm.emulate.emulation import run_emulation

    start = time.perf_counter()
    say = say or (lambda line: None)
    calibrations, cases, emulations = {}, [], []
    for n, k in zip(cfg.workers, cfg.dilations):
        load = os.getloadavg()[0]
        cal = calibrate(CalibrationConfig(n, cfg.bandwidth_bps / k, cfg.exchanges, cfg.sizes,
                                          cfg.reps, mode=cfg.calibration), say)
        calibrations[str(n)] = {**cal, "load_average_before": load}
        constants = {ex: {"overhead_s": f["overhead_s"], "efficiency": f["efficiency"]}
                     for ex, f in cal["exchanges"].items()}
        for workload in cfg.workloads:
            load = os.getloadavg()[0]
            emu = run_emulation(EmulateConfig(workload, n, cfg.bandwidth_bps, cfg.accelerator,
                                              dilation=k, iterations=cfg.iterations,
                                              warmup=cfg.warmup), exchanges=list(cfg.exchanges))
            emulations.append({"workload": workload, "workers": n, "dilation": k,
                               "wall_time_s": emu["summary"]["wall_time_s"],
                               "load_average_before": load,
                               "results": [{key: r[key] for key in (
                                   "exchange", "iteration_time_s", "measured_iterations_s",
                                   "comm_busy_s", "exposed_comm_s")} for r in emu["results"]]})
            for row in emu["results"]:
                ex = row["exchange"]
                sim = _simulate(cfg, workload, n, k, ex, {ex: constants[ex]})
                ideal = _simulate(cfg, workload, n, k, ex, None)
                measured = row["iteration_time_s"]
                case = {"workload": workload, "workers": n, "exchange": ex, "dilation": k,
                        "bandwidth_bps": cfg.bandwidth_bps, "measured_s": measured,
                        "simulated_s": sim["iteration_s"],
                        "error": sim["iteration_s"] / measured - 1,
                        "ideal_s": ideal["iteration_s"],
                        "ideal_error": ideal["iteration_s"] / measured - 1,
                        "compute_s": sim["compute_s"],
                        "measured_comm_busy_s": row["comm_busy_s"],
                        "simulated_comm_busy_s": sim["comm_busy_s"].get("dp", 0.0)}
                cases.append(case)
                say(f"{workload} n={n} {ex}: measured {measured * 1e3:.1f} ms, simulated "
                    f"{case['simulated_s'] * 1e3:.1f} ms ({case['error']:+.1%}; ideal network "
                    f"{case['ideal_error']:+.1%})")
    result = new_result("simulate-validate", asdict(cfg))
    result["calibration"] = calibrations
    result["emulations"] = emulations
    result["cases"] = cases
    errors = [abs(c["error"]) for c in cases]
    result["summary"] = {"cases": len(cases), "max_abs_error": max(errors),
                         "mean_abs_error": sum(errors) / len(errors),
                         "within_tolerance": all(e <= TOLERANCE for e in errors),
                         "tolerance": TOLERANCE,
                         "ideal_max_abs_error": max(abs(c["ideal_error"]) for c in cases),
                         "wall_time_s": time.perf_counter() - start}
    return result
