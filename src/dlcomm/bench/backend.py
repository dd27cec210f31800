"""``dlcomm bench backend``: the dlcomm c10d backend against the exchange hook, one job.

The same ``dlcomm train`` job runs with ``--backend gloo`` (gradients through dlcomm's DDP
comm hook) and ``--backend dlcomm`` (DDP with no hook over the c10d backend), the two
alternating repetition by repetition on the same (emulated) network, so that the machine's
drift falls on both alike. Each run's step time is the median of its steps' times after
the first epoch's first ``warmup`` steps; the result is the median over repetitions of each
variant and their ratio (docs/torch.md).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from dlcomm.results import new_result
from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.processes import run_or_fail
from dlcomm.train.report import median_step_time

__all__ = ["VARIANTS", "run_backend_bench", "step_time"]

VARIANTS = {"hook": ["--backend", "gloo"], "backend": ["--backend", "dlcomm"]}


step_time = median_step_time  # the median of a run's steps after the first ``warmup``


def _run(train_args: list[str], variant: str, out: Any, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "dlcomm", "train", *train_args, *VARIANTS[variant],
           "--json", str(out), "--quiet"]
    run_or_fail(cmd, f"training ({variant})", timeout_s)
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def run_backend_bench(train_args: list[str], reps: int, warmup: int = 5,
                      progress: Callable[[str], None] = print,
                      run_timeout_s: float = 1800.0) -> dict[str, Any]:
    """``reps`` interleaved pairs of runs; one JSON result (kind ``bench-backend``)."""
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with job_directory("bench-backend") as tmp:
        for rep in range(reps):
            for variant in VARIANTS:
                progress(f"repetition {rep + 1}/{reps}: {variant}")
                doc = _run(train_args, variant, tmp / "run.json", run_timeout_s)
                s = doc["summary"]
                rows.append({"rep": rep, "variant": variant,
                             "step_time_s": step_time(doc["steps"], warmup),
                             "time_per_step_s": s["time_per_step_s"],
                             "bytes_sent_per_worker_per_step":
                                 s["bytes_sent_per_worker_per_step"],
                             "final_loss": s.get("final_loss"),
                             "final_accuracy": s.get("final_accuracy"), "steps": s["steps"]})
    medians = {v: statistics.median(r["step_time_s"] for r in rows if r["variant"] == v)
               for v in VARIANTS}
    pairs = [b["step_time_s"] / h["step_time_s"] for h, b in
             zip(rows[0::2], rows[1::2])]
    result = new_result("bench-backend", {"train_args": train_args, "reps": reps,
                                          "warmup_steps": warmup})
    result["runs"] = rows
    result["summary"] = {
        "step_time_s": medians,
        "backend_over_hook": medians["backend"] / medians["hook"],
        "pair_ratios": pairs, "pair_ratio_median": statistics.median(pairs),
        "bytes_sent_per_worker_per_step": {
            v: statistics.median(r["bytes_sent_per_worker_per_step"] for r in rows
                                 if r["variant"] == v) for v in VARIANTS},
        "wall_time_s": time.perf_counter() - start}
    return result
