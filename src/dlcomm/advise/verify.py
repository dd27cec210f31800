"""``dlcomm advise --verify``: run the top candidates for real and score the prediction.

A trainable workload trains with ``dlcomm train`` (``--steps``, on the emulated network at
the cluster's link rate when run as root, else on loopback), and a candidate's measured
iteration is the median of its steps' times after a warm-up. A catalog model runs through
``dlcomm emulate`` (time-dilated; one cluster, every candidate in turn), whose iteration
time is at real scale. The ring always runs too: speedups are measured against it.

With ``repeats`` > 1 every candidate runs that many times, round by round, each round in
another order (:func:`run_order`), so that a slow spell of a shared machine falls on all of
them alike; a candidate's measured iteration is the median of its runs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.processes import run_or_fail
from dlcomm.train.report import median_step_time

__all__ = ["median_step_time", "train_args_for", "verify_trainable", "verify_catalog",
           "score", "run_order", "medians", "round_speedups"]

Runs = dict[str, list[float]]  # candidate label -> its measured iteration, run by run


def run_order(count: int, repeats: int) -> list[int]:
    """The indices of ``count`` candidates for ``repeats`` rounds, round r rotated by r:
    every candidate runs once a round, and each takes each place in turn (pure)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    return [(r + i) % count for r in range(repeats) for i in range(count)]


def medians(runs: Runs) -> dict[str, float]:
    """Each candidate's median run."""
    return {label: float(statistics.median(times)) for label, times in runs.items()}


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
                     timeout_s: float = 1800.0, doing: str = "verifying",
                     repeats: int = 1) -> Runs:
    """candidate label -> the median step time (s) of each of its runs."""
    runs: Runs = {cand["candidate"]: [] for cand in candidates}
    order = run_order(len(candidates), repeats)
    with job_directory("advise") as tmp:
        for done, index in enumerate(order):
            cand = candidates[index]
            out = tmp / "run.json"
            count = f" ({done + 1}/{len(order)})" if repeats > 1 else ""
            progress(f"{doing} {cand['candidate']}{count}")
            cmd = [sys.executable, "-m", "dlcomm", "train", *job_args, *train_args_for(cand),
                   "--steps", str(steps), "--eval-every", str(10 * steps), "--json", str(out),
                   "--quiet"]
            run_or_fail(cmd, f"{doing} {cand['candidate']}", timeout_s)
            runs[cand["candidate"]].append(median_step_time(
                json.loads(out.read_text())["steps"], warmup))
    return runs


def _forward(line: str, progress: Callable[[str], None]) -> None:
    """The emulation's progress lines, not its ranks' warnings."""
    if line.startswith("emulation: "):
        progress(line)


def verify_catalog(emulate_args: list[str], candidates: list[dict[str, Any]],
                   progress: Callable[[str], None] = print,
                   timeout_s: float = 3600.0, repeats: int = 1) -> Runs:
    """candidate label -> emulated iteration time at real scale (s) of each of its runs,
    all on one emulated cluster."""
    specs = []
    for cand in candidates:
        spec = cand["exchange"] if not cand.get("method") else \
            f"compressed:method={cand['method']},over={cand['exchange']}"
        specs.append(spec)
    order = run_order(len(candidates), repeats)
    times = f", {repeats} runs each" if repeats > 1 else ""
    progress(f"verifying {', '.join(c['candidate'] for c in candidates)} "
             f"(time-dilated{times})")
    with job_directory("advise") as tmp:
        out = tmp / "emulate.json"
        run_or_fail([sys.executable, "-m", "dlcomm", "emulate", *emulate_args, "--exchange",
                     ",".join(specs[i] for i in order), "--json", str(out)],
                    "verifying the emulation", timeout_s * repeats,
                    on_line=lambda line: _forward(line, progress))
        rows = json.loads(out.read_text())["results"]
    runs: Runs = {cand["candidate"]: [] for cand in candidates}
    for index, row in zip(order, rows):
        runs[candidates[index]["candidate"]].append(float(row["iteration_time_s"]))
    return runs


def round_speedups(runs: Runs, label: str) -> list[float]:
    """``label``'s speedup over the ring in each round (run r of every candidate is round
    r: each round ran every candidate once), the spread a median speedup hides (pure)."""
    return [ring / run for ring, run in zip(runs.get("ring", []), runs[label]) if run > 0]


def score(predictions: list[dict[str, Any]], runs: Runs,
          tolerance: float = 0.05) -> dict[str, Any]:
    """Prediction errors against each candidate's median run, and whether the
    recommendation was (within ``tolerance`` of) the measured fastest; with the speedups
    round by round, whether the predicted speedup lies within their range."""
    measured = medians(runs)
    rows = [p for p in predictions if p["candidate"] in measured]
    ring_m = measured.get("ring")
    ring_p = next((p["iteration_s"] for p in rows if p["candidate"] == "ring"), None)
    out_rows = []
    for p in rows:
        m = measured[p["candidate"]]
        row = {"candidate": p["candidate"], "predicted_s": p["iteration_s"], "measured_s": m,
               "measured_runs_s": runs[p["candidate"]], "error": p["iteration_s"] / m - 1}
        if ring_m and ring_p:
            row["predicted_speedup"] = ring_p / p["iteration_s"]
            row["measured_speedup"] = ring_m / m
            row["speedup_error"] = row["predicted_speedup"] / row["measured_speedup"] - 1
            rounds = round_speedups(runs, p["candidate"])
            row["measured_speedup_rounds"] = rounds
            row["predicted_within_rounds"] = bool(rounds) and \
                min(rounds) <= row["predicted_speedup"] <= max(rounds)
        out_rows.append(row)
    best = min(measured, key=lambda c: measured[c])
    recommended = predictions[0]["candidate"]
    rec_m = measured.get(recommended)
    rec_row = next((r for r in out_rows if r["candidate"] == recommended), {})
    return {"rows": out_rows, "measured_fastest": best, "recommended": recommended,
            "recommendation_ok": rec_m is not None and rec_m <= (1 + tolerance) * measured[best],
            "worst_speedup_error": max((abs(r.get("speedup_error", 0.0)) for r in out_rows),
                                       default=0.0),
            "recommended_speedup_error": rec_row.get("speedup_error"),
            "recommended_speedup_rounds": rec_row.get("measured_speedup_rounds"),
            "repeats": max((len(times) for times in runs.values()), default=0),
            "cores": os.cpu_count()}
