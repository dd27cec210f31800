"""``dlcomm bench fidelity``: how faithful is the emulator on this machine?

Two measurements (issue: emulated cluster fidelity checks), in one JSON:

1. ring all-reduce of S bytes on the emulated star vs the bandwidth bound 2(n-1)/n * S / B
   for every (n, S) asked for;
2. the emulated iteration time of one workload at dilation K and 2K (they should agree).
"""

from __future__ import annotations

import time
from typing import Any

from dlcomm.bench.allreduce import AllreduceBench
from dlcomm.bench.run import run_allreduce
from dlcomm.emulate.dilation import EmulateConfig
from dlcomm.emulate.emulation import run_emulation
from dlcomm.emulate.placement import NetworkOptions
from dlcomm.results import new_result

__all__ = ["run_fidelity"]


def run_fidelity(cases: list[tuple[int, int, str]], workload: str, workers: int,
                 bandwidth_bps: float, dilations: tuple[float, float], reps: int = 3,
                 progress: Any = print) -> dict[str, Any]:
    """``cases``: (workers, size_bytes, link rate) for the ring-vs-bound measurements."""
    start = time.perf_counter()
    ring_rows = []
    for n, size, rate in cases:
        progress(f"ring all-reduce: {n} workers, {size / 1e6:g} MB, {rate}")
        res = run_allreduce(AllreduceBench(("ring",), n, size, reps),
                            NetworkOptions("emulated", rate))
        row = res["results"][0]
        ring_rows.append({"workers": n, "size_bytes": size, "bandwidth": rate,
                          "time_s": row["time_s"], "bound_s": row["bound_s"],
                          "time_over_bound": row["time_over_bound"],
                          "cpu_utilization": row["cpu_utilization"]})
    dil_rows = []
    for k in dilations:
        progress(f"emulated {workload}: {workers} workers, dilation {k:g}")
        res = run_emulation(EmulateConfig(workload, workers, bandwidth_bps, dilation=k,
                                          iterations=reps))
        s = res["summary"]
        dil_rows.append({"dilation": k, "iteration_time_s": s["iteration_time_s"],
                         "measured_iteration_s": s["measured_iteration_s"]})
    times = [r["iteration_time_s"] for r in dil_rows]
    result = new_result("bench-fidelity", {"cases": cases, "workload": workload,
                                           "workers": workers, "bandwidth_bps": bandwidth_bps,
                                           "dilations": list(dilations), "reps": reps})
    result["ring"] = ring_rows
    result["dilation"] = dil_rows
    result["summary"] = {
        "worst_time_over_bound": max(r["time_over_bound"] for r in ring_rows),
        "dilation_spread": (max(times) - min(times)) / min(times),
        "wall_time_s": time.perf_counter() - start}
    return result
