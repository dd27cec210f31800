"""The parent side of ``dlcomm emulate``: choose K, place workers, assemble the result."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from dlcomm.emulate.check import measure_capacity
from dlcomm.emulate.cluster import require_root
from dlcomm.emulate.dilation import (
    EmulateConfig,
    breakdown,
    config_dict,
    nice_dilation,
    schedule_for,
)
from dlcomm.emulate.placement import NetworkOptions, placement
from dlcomm.results import new_result
from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.launcher import launch
from dlcomm.switch.service import switches_for_job

__all__ = ["choose_dilation", "run_emulation", "CAPACITY_SHARE"]

# The emulated links together may use this share of the machine's measured capacity:
# every host sends and receives at once, and workers also copy and reduce what they move.
CAPACITY_SHARE = 0.3
DEADLINE_S = 3600.0  # one exchange's emulation, at most (a stuck rank is stopped)


def choose_dilation(bandwidth_bps: float, workers: int, capacity_bps: float) -> float:
    """Smallest nice K such that ``workers`` links at bandwidth/K fit the machine."""
    per_link = CAPACITY_SHARE * capacity_bps / max(workers, 1)
    return nice_dilation(bandwidth_bps / per_link)


def run_emulation(cfg: EmulateConfig, topology: str = "star", auto_dilation: bool = False,
                  exchanges: Sequence[str] | None = None,
                  progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Emulate ``cfg`` (choosing K first when ``auto_dilation``) and return the result.

    Every exchange in ``exchanges`` (default: ``cfg.exchange``) is measured in turn on the
    same emulated cluster with the same K, so their iteration times compare like with like;
    ``progress`` hears of each as it starts and ends.
    """
    require_root()
    start = time.perf_counter()
    exchanges = list(exchanges or [cfg.exchange])
    calibration = None
    if auto_dilation:
        progress("emulation: measuring this machine's capacity for emulated traffic")
        calibration = measure_capacity(max(1, cfg.workers // 2))
        cfg = replace(cfg, dilation=choose_dilation(cfg.bandwidth_bps, cfg.workers,
                                                    calibration["capacity_bps"]))
    measured = "" if calibration is None else \
        f" (capacity {calibration['capacity_bps'] / 1e9:.1f} Gbit/s)"
    progress(f"emulation: {cfg.workers} workers, time dilation K={cfg.dilation:g}{measured}")
    sched = schedule_for(cfg)
    net = NetworkOptions("emulated", f"{cfg.bandwidth_bps / cfg.dilation:.0f}bit", topology)
    rows = []
    with job_directory("emulate") as tmp, \
            placement(net, cfg.workers) as place, \
            switches_for_job(exchanges, place.service_host,
                             place.service_prefix()) as (specs, service):
        for i, (requested, spec) in enumerate(zip(exchanges, specs), 1):
            progress(f"emulation: {requested} ({i}/{len(exchanges)})")
            part = tmp / "measured.json"
            job = replace(cfg, exchange=spec, result_path=str(part),
                          job_name=f"emu{os.getpid()}")
            launch(config_dict(job), cfg.workers, place, entry=("run-job", "emulate"),
                   deadline_s=DEADLINE_S)
            gathered = json.loads(part.read_text())
            rows.append({"exchange": requested, **breakdown(cfg, sched, gathered),
                         "exchange_stats": [w["stats"] for w in gathered]})
            progress(f"emulation: {requested} ({i}/{len(exchanges)}): "
                     f"{rows[-1]['iteration_time_s'] * 1e3:.1f} ms per iteration")
        info = place.info
    result = new_result("emulate", {**config_dict(cfg), "exchanges": exchanges,
                                    "topology": topology, "auto_dilation": auto_dilation})
    result["network"] = info
    result["calibration"] = calibration
    first = rows[0]
    result["results"] = rows
    result["summary"] = {**{k: v for k, v in first.items() if k != "exchange_stats"},
                         f"speedup_over_{first['exchange']}": {
                             r["exchange"]: first["iteration_time_s"] / r["iteration_time_s"]
                             for r in rows},
                         "wall_time_s": time.perf_counter() - start}
    result["buckets"] = [{"numel": n, "ready_s": r}
                         for n, r in zip(sched.bucket_numel, sched.bucket_ready_s)]
    result["switch"] = service.final_stats if service else None
    return result
