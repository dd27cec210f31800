"""``dlcomm bench train``: the same training run through several exchanges, side by side.

Each exchange trains the workload from the same seed on the same (emulated) network, one
after another; the result compares time per step, communication wait, bytes, and the wall
time until the run first reached a target (test loss, accuracy or perplexity, read from
each run's evaluations).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.results import new_result
from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.processes import run_or_fail

__all__ = ["time_to_target", "run_train_bench"]


def time_to_target(evals: list[dict[str, Any]], metric: str, target: float) -> float | None:
    """Wall time of the first evaluation that reached ``target`` (None if none did);
    loss and perplexity must fall to it, accuracy rise to it."""
    for e in evals:
        value = e.get(metric)
        if value is None:
            continue
        if (value >= target) if metric == "accuracy" else (value <= target):
            return float(e["time_s"])
    return None


def run_train_bench(exchanges: list[str], train_args: list[str], metric: str, target: float,
                    progress: Any = print, run_timeout_s: float = 3600.0) -> dict[str, Any]:
    """Run ``dlcomm train TRAIN_ARGS --exchange E`` for every E (each stopped, and the
    benchmark failed, after ``run_timeout_s``); one JSON result."""
    if metric not in ("loss", "accuracy", "perplexity"):
        raise ConfigError(f"target metric must be loss, accuracy or perplexity, got {metric!r}")
    start = time.perf_counter()
    rows = []
    with job_directory("bench-train") as tmp:
        for exchange in exchanges:
            out = tmp / "run.json"
            progress(f"training with {exchange}")
            cmd = [sys.executable, "-m", "dlcomm", "train", *train_args, "--exchange", exchange,
                   "--json", str(out), "--quiet"]
            run_or_fail(cmd, f"training with {exchange}", run_timeout_s)
            doc = json.loads(out.read_text())
            s = doc["summary"]
            rows.append({"exchange": exchange,
                         "time_to_target_s": time_to_target(doc["evals"], metric, target),
                         "time_per_step_s": s["time_per_step_s"],
                         "comm_wait_per_step_s": s["comm_wait_per_step_s"],
                         "bytes_sent_per_worker_per_step": s["bytes_sent_per_worker_per_step"],
                         "block_density": s.get("block_density"),
                         "final": {k: s.get(k) for k in ("final_loss", "final_accuracy",
                                                         "final_perplexity")},
                         "steps": s["steps"], "wall_time_s": s["wall_time_s"],
                         "evals": doc["evals"], "network": (doc["config"].get("extra") or {}
                                                            ).get("network_info")})
    first = rows[0]
    result = new_result("bench-train", {"exchanges": exchanges, "train_args": train_args,
                                        "metric": metric, "target": target})
    result["results"] = rows
    result["summary"] = {
        "time_per_step_s": {r["exchange"]: r["time_per_step_s"] for r in rows},
        "time_to_target_s": {r["exchange"]: r["time_to_target_s"] for r in rows},
        f"step_speedup_over_{first['exchange']}": {
            r["exchange"]: first["time_per_step_s"] / r["time_per_step_s"] for r in rows},
        "wall_time_s": time.perf_counter() - start}
    return result
