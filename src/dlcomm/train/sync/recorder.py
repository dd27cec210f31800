"""What decentralized workers keep beyond :mod:`dlcomm.train.common`: step records and model
snapshots over time (:class:`Recorder`), the job's store, and the barrier at the end of
training that names a worker that never finishes.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from dlcomm.errors import ExchangeTimeout
from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.common import Learner, Progress, StepRecord
from dlcomm.train.sync.report import SyncReport

__all__ = ["Recorder", "job_store", "wait_until_all_finished"]


def job_store(env: WorkerEnv, timeout_s: float) -> dist.TCPStore:
    """A client of the job's env:// store (MASTER_ADDR:MASTER_PORT)."""
    return dist.TCPStore(env.master_addr, env.master_port, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def wait_until_all_finished(env: WorkerEnv, timeout_s: float, what: str) -> None:
    """Say this worker has finished training; wait until every worker has.

    Asynchronous workers end at different times; the collectives that follow (evaluation,
    gathering reports) would otherwise fail with a message that names nobody. Here a
    worker that never finishes (hung, or far slower) is named."""
    store = job_store(env, timeout_s)
    store.set(f"dlcomm-sync/finished/{env.rank}", "1")
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in range(env.world_size)
                   if not store.check([f"dlcomm-sync/finished/{r}"])]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ExchangeTimeout(f"{what}: rank {env.rank} waited {timeout_s:g} s for "
                                  f"rank(s) {missing} to finish training (hung, or far "
                                  "slower than the others)")
        time.sleep(0.02)


class Recorder:
    """Step records, comm-wait and byte counts per step, and model snapshots over time.

    Snapshots let the workers reconstruct, after training, the average model as it was at
    any moment (:mod:`.evaluation`) without a collective during training. One is taken
    after every step, up to ``budget_bytes``; beyond it every other snapshot is dropped and
    the interval doubles, so a snapshot is never more than ``interval`` steps old."""

    def __init__(self, rank: int, every: int, progress: Progress | None = None,
                 budget_bytes: int = 256 * 2**20) -> None:
        self.report = SyncReport(rank)
        self.progress = progress
        self.every = max(every, 1)              # evaluation points, in mean steps
        self.interval = 1                       # steps between snapshots
        self.budget_bytes = budget_bytes
        self.snapshots: list[tuple[float, int, torch.Tensor]] = []
        self.start = time.perf_counter()
        self._bytes = (0, 0)

    def start_together(self, learner: Learner) -> None:
        """Wait for every worker (a barrier), then start the clock: times are comparable."""
        dist.barrier()
        self.begin(learner.vector())

    def begin(self, vector: torch.Tensor) -> None:
        self.start = time.perf_counter()
        self.snapshots = [(0.0, 0, vector)]

    def now(self) -> float:
        return time.perf_counter() - self.start

    def step(self, learner: Learner, loss: float, t0: float, wait_s: float,
             bytes_now: tuple[int, int]) -> None:
        """Record the step that started at ``t0`` (a ``now()`` value)."""
        t1 = self.now()
        sent, received = bytes_now[0] - self._bytes[0], bytes_now[1] - self._bytes[1]
        self._bytes = bytes_now
        self.report.steps.append(StepRecord(learner.steps - 1, learner.epoch, t1, loss,
                                            t1 - t0, wait_s, sent, received))
        if learner.steps % self.interval == 0:
            self._snapshot(t1, learner.steps, learner.vector())
        if self.progress is not None:
            self.progress.advance(f"loss {loss:.3g}  wait {wait_s * 1e3:.0f} ms")

    def _snapshot(self, t: float, steps: int, vector: torch.Tensor) -> None:
        self.snapshots.append((t, steps, vector))
        size = sum(x.numel() * x.element_size() for _, _, x in self.snapshots)
        if size > self.budget_bytes and len(self.snapshots) > 2:
            self.interval *= 2
            self.snapshots = [s for s in self.snapshots if s[1] % self.interval == 0]

    def end(self, vector: torch.Tensor, steps: int) -> None:
        """The final model (after the last exchange) and the end of this worker's run."""
        self.snapshots.append((self.now(), steps, vector))
        self.report.end_time_s = self.snapshots[-1][0]
