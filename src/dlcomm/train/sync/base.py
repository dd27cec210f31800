"""The registry of ``--sync`` protocols and what a protocol is.

A :class:`Protocol` trains one worker and hands rank 0 every worker's report. Two kinds:

- ``bsp`` (:mod:`.bsp`): the synchronous DDP loop, gradients through an exchange;
- :class:`Decentralized` protocols (``hop``, ``prague``, ``adpsgd``): no global barrier;
  each implements :meth:`Decentralized.run` (its loop around a pure state machine), and
  this base does what they share: the learner, the recorder of steps and snapshots, and the
  evaluation of the consensus model after training (:mod:`.evaluation`).
"""

from __future__ import annotations

import abc

from dlcomm.registry import Registry
from dlcomm.runtime.env import WorkerEnv
from dlcomm.runtime.failures import report_failure
from dlcomm.train.common import Learner, Progress, WorkerReport
from dlcomm.train.config import TrainConfig
from dlcomm.train.sync.evaluation import finish_run
from dlcomm.train.sync.recorder import Recorder
from dlcomm.workloads import Workload

__all__ = ["Protocol", "Decentralized", "SYNCS"]


class Protocol(abc.ABC):
    """A way of training, with its options, ready to run on one worker."""

    name = "protocol"

    @abc.abstractmethod
    def check(self, world: int) -> None:
        """Raise ConfigError if the options cannot work with ``world`` workers."""

    @abc.abstractmethod
    def train(self, cfg: TrainConfig, env: WorkerEnv, workload: Workload
              ) -> list[WorkerReport] | None:
        """Train this worker; rank 0 gets every worker's report, the others None."""


SYNCS: Registry[Protocol] = Registry("sync protocol")


class Decentralized(Protocol):
    """A protocol without a global barrier: workers agree by messages among themselves."""

    @abc.abstractmethod
    def run(self, cfg: TrainConfig, env: WorkerEnv, learner: Learner,
            recorder: Recorder) -> int:
        """Train this worker until the run ends; returns the protocol's iteration count.
        Must call ``recorder.start_together(learner)`` once its set-up is done."""

    def train(self, cfg: TrainConfig, env: WorkerEnv, workload: Workload
              ) -> list[WorkerReport] | None:
        learner = Learner(cfg, env, workload)
        progress = Progress(env.rank == 0 and not cfg.quiet, learner.total,
                            f"{workload.name} x{env.world_size} {self.name}")
        recorder = Recorder(env.rank, cfg.eval_every or learner.per_epoch, progress)
        recorder.report.exchange = {"counting": "payload"}
        try:
            iterations = self.run(cfg, env, learner, recorder)
        except BaseException as exc:
            report_failure(exc)  # before this worker's sockets close (runtime.failures)
            raise
        finally:
            progress.close()
        recorder.end(learner.vector(), learner.steps)
        recorder.report.protocol = cfg.sync
        recorder.report.iterations = iterations
        return finish_run(learner, recorder, env)
