"""Evaluation of decentralized runs, after training, from snapshots taken during it.

Asynchronous workers hold different models and must not meet in a collective while they
train, so each worker keeps snapshots of its model and, once every worker has stopped:

1. the workers share their step end times (all_gather of a few floats); each kept
   snapshots of its model after its steps (:class:`~.local.Recorder`);
2. evaluation points are the moments at which the mean number of steps taken across
   workers crossed each multiple of ``eval_every`` (the analogue of BSP's step count),
   plus the end of the run;
3. at each point, every worker contributes its latest snapshot taken no later than that
   moment; their average (all_reduce) is the **consensus model**, evaluated on the test
   set like BSP's model (sharded, trainer.evaluate);
4. the **consensus distance** at that point is the mean over workers of the squared L2
   distance of the worker's snapshot to the average, ``(1/n) sum_w ||x_w - x_bar||^2``;
5. each worker also scores its own final model on the whole test set.

So the wall-clock times of ``evals[]`` are training times (the evaluation itself is not
in them), and a worker contributes the model it held at that moment, to within one
snapshot interval (one step unless the snapshot memory budget was reached).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.common import Learner, WorkerReport, evaluate
from dlcomm.train.sync.recorder import Recorder, wait_until_all_finished
from dlcomm.workloads import finish_metrics

__all__ = ["eval_points", "finish_run", "evaluate_own"]


def eval_points(step_times: list[list[float]], every: int) -> list[tuple[float, int]]:
    """(time, k * every) for each k at which the mean steps over workers reached k * every."""
    workers = len(step_times)
    merged = sorted(t for times in step_times for t in times)
    points = []
    target = every
    for count, t in enumerate(merged, start=1):
        while count / workers >= target:
            points.append((t, target))
            target += every
    return points


def evaluate_own(model: torch.nn.Module, learner: Learner) -> dict[str, float]:
    """``model`` on the whole test set, on this worker alone (no collective)."""
    workload = learner.workload
    sums = torch.zeros(3, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(workload.test_set, batch_size=256):
            sums += workload.eval_sums(model(x), y)
    model.train()
    return finish_metrics(workload.metric, sums)


def report_name(recorder: Recorder) -> str:
    return recorder.report.protocol.partition(":")[0] or "sync"


def finish_run(learner: Learner, recorder: Recorder, env: WorkerEnv
               ) -> list[WorkerReport] | None:
    """Evaluate the consensus model over time and gather every report on rank 0.

    Every worker must call this after it has stopped training (it is a collective, entered
    once every worker has said it finished)."""
    wait_until_all_finished(env, learner.cfg.timeout_s, report_name(recorder))
    report = recorder.report
    timeline: dict[str, Any] = {"steps": [s.time_s for s in report.steps],
                                "end": report.end_time_s, "total": learner.steps}
    everyone: list[Any] = [None] * env.world_size
    dist.all_gather_object(everyone, timeline)
    every = recorder.every
    end = max(w["end"] for w in everyone)
    mean_steps = sum(w["total"] for w in everyone) / env.world_size
    points = [p for p in eval_points([w["steps"] for w in everyone], every)
              if p[1] < mean_steps]
    scratch = copy.deepcopy(learner.model)
    scratch_params = [p for p in scratch.parameters() if p.requires_grad]
    evals = []
    for t, step in [*points, (end, mean_steps)]:
        final = t == end and step == mean_steps
        mine = recorder.snapshots[-1][2] if final else next(
            x for time_s, _, x in reversed(recorder.snapshots) if time_s <= t)
        average = mine.clone()
        dist.all_reduce(average)
        average /= env.world_size
        spread = ((mine - average) ** 2).sum().reshape(1).double()
        dist.all_reduce(spread)
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(average, scratch_params)
        metrics = evaluate(scratch, learner.workload, env)
        evals.append({"step": step if not final else round(step, 2),
                      "epoch": int(step // learner.per_epoch), "time_s": t, **metrics,
                      "consensus_distance": float(spread.item()) / env.world_size})
    report.evals = evals
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(recorder.snapshots[-1][2], scratch_params)
    report.own_final = evaluate_own(scratch, learner)
    gathered: list[WorkerReport | None] = [None] * env.world_size
    dist.gather_object(report, gathered if env.rank == 0 else None, dst=0)
    return [r for r in gathered if r is not None] if env.rank == 0 else None
