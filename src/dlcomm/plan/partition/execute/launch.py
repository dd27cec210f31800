"""Run an executed partition plan on p local ranks and collect their reports.

:func:`run_job` writes nothing itself: it starts p ranks of ``dlcomm run-job partition``
through dlcomm's one launcher (:mod:`dlcomm.runtime.launcher`: the job's rendezvous, ranks
that die with their parent, the root cause of a failure named, a deadline), each writing
its report and gradient shards into an output directory of the job's, then reads them.
"""

from __future__ import annotations

from typing import Any

from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.launcher import launch

__all__ = ["run_job", "DEADLINE_SLACK_S"]

DEADLINE_SLACK_S = 30.0  # beyond the collectives' timeout: start-up and writing the reports


def run_job(job: dict[str, Any], world: int, timeout_s: float) -> list[tuple[dict, dict]]:
    """Run the job on ``world`` local ranks; ``[(report, gradient shards)]`` by rank."""
    import json

    import torch

    with job_directory("partition") as out:
        launch({**job, "timeout_s": timeout_s, "out_dir": str(out)}, world,
               entry=("run-job", "partition"), rank0_output=False,
               deadline_s=timeout_s + DEADLINE_SLACK_S, kind="partition-job")
        results = []
        for rank in range(world):
            report = json.loads((out / f"rank{rank}.json").read_text())
            shards = torch.load(out / f"rank{rank}.pt", weights_only=True)
            results.append((report, shards))
        return results
