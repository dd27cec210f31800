"""``dlcomm advise --verify``: run the top candidates for real and score the prediction.

A trainable workload trains with ``dlcomm train`` (``--steps``, on the emulated network at
the cluster's link rate when run as root, else on loopback), and a candidate's measured
iteration is the median of its steps' times after a warm-up. A catalog model runs through
``dlcomm emulate`` (time-dilated; one cluster, every candidate in turn), whose iteration
time is at real scale. The ring always runs too: speedups are measured against it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.processes import run_or_fail
from dlcomm.train.report import median_step_time

__all__ = ["median_step_time", "train_args_for", "verify_trainable", "verify_catalog",
           "score"]


def train_args_for(candidate: dict[str, Any]) -> list[str]:
    """The ``dlcomm train`` options of one candidate row of the advise result."""
    args = ["--exchange", candidate["exchange"]]
    if candidate.get("method"):
        args += ["--compress", candidate["method"]]
    if candidate.get("sync", "bsp") != "bsp":
        args += ["--sync", candidate["sync"]]
    return args


def verify_trainable(job_args: list[str], candidates: list[dict[str, Any]], steps: int,
                     warmup: int, progress: Callable[[str], None] = print,
                     timeout_s: float = 1800.0, doing: str = "verifying") -> dict[str, float]:
    """candidate label -> measured median step time (s)."""
    measured = {}
    with job_directory("advise") as tmp:
        for cand in candidates:
            out = tmp / "run.json"
            progress(f"{doing} {cand['candidate']}")
            cmd = [sys.executable, "-m", "dlcomm", "train", *job_args, *train_args_for(cand),
                   "--steps", str(steps), "--eval-every", str(10 * steps), "--json", str(out),
                   "--quiet"]
            run_or_fail(cmd, f"{doing} {cand['candidate']}", timeout_s)
            measured[cand["candidate"]] = median_step_time(
                json.loads(out.read_text())["steps"], warmup)
    return measured


def verify_catalog(emulate_args: list[str], candidates: list[dict[str, Any]],
                   progress: Callable[[str], None] = print,
                   timeout_s: float = 3600.0) -> dict[str, float]:
    """candidate label -> emulated iteration time at real scale (s)."""
    specs = []
    for cand in candidates:
        spec = cand["exchange"] if not cand.get("method") else \
            f"compressed:method={cand['method']},over={cand['exchange']}"
        specs.append(spec)
    progress(f"verifying {', '.join(c['candidate'] for c in candidates)} (time-dilated)")
    with job_directory("advise") as tmp:
        out = tmp / "emulate.json"
        run_or_fail([sys.executable, "-m", "dlcomm", "emulate", *emulate_args, "--exchange",
                     ",".join(specs), "--json", str(out)], "verifying the emulation", timeout_s)
        rows = json.loads(out.read_text())["results"]
    return {cand["candidate"]: float(row["iteration_time_s"])
            for cand, row in zip(candidates, rows)}


def score(predictions: list[dict[str, Any]], measured: dict[str, float],
          tolerance: float = 0.05) -> dict[str, Any]:
    """Prediction errors, and whether the recommendation was (within ``tolerance`` of) the
    measured fastest."""
    rows = [p for p in predictions if p["candidate"] in measured]
    ring_m = measured.get("ring")
    ring_p = next((p["iteration_s"] for p in rows if p["candidate"] == "ring"), None)
    out_rows = []
    for p in rows:
        m = measured[p["candidate"]]
        row = {"candidate": p["candidate"], "predicted_s": p["iteration_s"], "measured_s": m,
               "error": p["iteration_s"] / m - 1}
        if ring_m and ring_p:
            row["predicted_speedup"] = ring_p / p["iteration_s"]
            row["measured_speedup"] = ring_m / m
            row["speedup_error"] = row["predicted_speedup"] / row["measured_speedup"] - 1
        out_rows.append(row)
    best = min(measured, key=lambda c: measured[c])
    recommended = predictions[0]["candidate"]
    rec_m = measured.get(recommended)
    return {"rows": out_rows, "measured_fastest": best, "recommended": recommended,
            "recommendation_ok": rec_m is not None and rec_m <= (1 + tolerance) * measured[best],
            "worst_speedup_error": max((abs(r.get("speedup_error", 0.0)) for r in out_rows),
                                       default=0.0),
            "cores": os.cpu_count()}
