"""The decentralized protocols' additions to a worker's report and to the run's summary.

A :class:`SyncReport` is a trainer ``WorkerReport`` (so ``train.report.train_result``
builds the usual result from it) whose ``summary()`` adds a ``sync`` object per worker,
and whose ``run_summary(reports)`` gives the run-level ``summary.sync`` (docs/sync.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlcomm.train.common import WorkerReport

__all__ = ["SyncReport", "max_step_spread"]


@dataclass
class SyncReport(WorkerReport):
    protocol: str = ""
    end_time_s: float = 0.0          # this worker's end of training (since the common start)
    iterations: int = 0              # the protocol's iteration counter (Hop: skips included)
    gaps: dict[str, int] = field(default_factory=dict)  # neighbour -> largest gap observed
    own_final: dict[str, float] = field(default_factory=dict)  # own model on the test set
    stats: dict[str, Any] = field(default_factory=dict)  # protocol counters

    def summary(self) -> dict[str, Any]:
        base = super().summary()
        duration = max(self.end_time_s, 1e-9)
        base["sync"] = {
            "protocol": self.protocol,
            "steps_per_s": len(self.steps) / duration,
            "iterations": self.iterations,
            "iterations_per_s": self.iterations / duration,
            "max_gap": max(self.gaps.values(), default=0),
            "gaps": self.gaps,
            "end_time_s": self.end_time_s,
            "own_final": self.own_final,
            "stats": self.stats,
        }
        return base

    def run_summary(self, reports: list[WorkerReport]) -> dict[str, Any]:
        """The run's ``summary.sync``: rates, gaps, consensus, own-model accuracy."""
        mine = [r for r in reports if isinstance(r, SyncReport)]
        rates = [len(r.steps) / max(r.end_time_s, 1e-9) for r in mine]
        own = [r.own_final.get("accuracy") for r in mine if "accuracy" in r.own_final]
        final = self.evals[-1] if self.evals else {}
        return {
            "protocol": self.protocol,
            "max_iteration_gap": max((max(r.gaps.values(), default=0) for r in mine), default=0),
            "max_step_spread": max_step_spread([[s.time_s for s in r.steps] for r in mine]),
            "steps_per_s": {"min": min(rates, default=0.0), "max": max(rates, default=0.0),
                            "per_worker": rates},
            "steps_per_worker": [len(r.steps) for r in mine],
            "final_consensus_distance": final.get("consensus_distance"),
            "own_final_accuracy": ({"min": min(own), "mean": sum(own) / len(own)}
                                   if own else None),
        }


def max_step_spread(step_times: list[list[float]]) -> int:
    """Largest difference, at any moment, between the steps two workers had completed
    (while both were still training). ``step_times[w]`` are w's step end times, sorted."""
    ends = [times[-1] if times else 0.0 for times in step_times]
    events = sorted((t, w) for w, times in enumerate(step_times) for t in times)
    done = [0] * len(step_times)
    worst = 0
    for t, w in events:
        done[w] += 1
        running = [done[v] for v in range(len(step_times)) if ends[v] >= t]
        if running:
            worst = max(worst, max(running) - min(running))
    return worst
