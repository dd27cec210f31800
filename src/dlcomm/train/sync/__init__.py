"""Decentralized training: how workers agree on a model without a global barrier.

``dlcomm train --sync SPEC`` selects the protocol (docs/sync.md):

- ``bsp``: the synchronous DDP all-reduce of trainer.py (the baseline);
- ``hop:...``: Hop (ASPLOS'19), gossip on a communication graph with update queues and
  token queues that bound the iteration gap, backup workers, staleness, skipping;
- ``prague:...``: Prague (ASPLOS'20), partial all-reduce within groups handed out by a
  group generator (random, static schedule, or a buffer of ready workers);
- ``adpsgd``: AD-PSGD (ICML'18), asynchronous pairwise averaging, active/passive split.

Layout: the protocols' state machines are pure and tested without processes
(graphs.py, hop.py, prague.py, adpsgd.py, sim.py); the process layer around them is thin
(p2p.py, service.py, preduce.py, run_*.py); local.py and evaluation.py are shared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlcomm.train.config import TrainConfig
    from dlcomm.runtime.env import WorkerEnv
    from dlcomm.train.trainer import WorkerReport
    from dlcomm.workloads import Workload

__all__ = ["train_decentralized", "parse_sync", "check_sync"]


def check_sync(text: str, world: int | None = None) -> None:
    """Raise ConfigError (one line) if ``text`` is not a usable ``--sync`` spec."""
    if text.strip() == "bsp":
        return
    parse_sync(text, world)


def parse_sync(text: str, world: int | None = None):  # type: ignore[no-untyped-def]
    from dlcomm.train.sync.protocols import parse_sync as parse
    return parse(text, world)


def train_decentralized(cfg: "TrainConfig", env: "WorkerEnv"
                        ) -> tuple["Workload", list["WorkerReport"] | None]:
    """Train this worker with ``cfg.sync``; rank 0 gets every worker's report."""
    from dlcomm.train.sync.evaluation import finish_run
    from dlcomm.train.sync.local import Learner, Recorder
    from dlcomm.train.sync.protocols import parse_sync as parse
    from dlcomm.train.trainer import _Progress
    from dlcomm.workloads import make_workload

    protocol = parse(cfg.sync, env.world_size)
    workload = make_workload(cfg.workload, seed=cfg.seed)
    learner = Learner(cfg, env, workload)
    progress = _Progress(env.rank == 0 and not cfg.quiet, learner.total,
                         f"{workload.name} x{env.world_size} {protocol.name}")
    recorder = Recorder(env.rank, cfg.eval_every or learner.per_epoch, progress)
    recorder.report.exchange = {"counting": "payload"}
    try:
        iterations = protocol.run(cfg, env, learner, recorder)
    finally:
        if progress is not None:
            progress.close()
    recorder.end(learner.vector(), learner.steps)
    recorder.report.protocol = cfg.sync
    recorder.report.iterations = iterations
    return workload, finish_run(learner, recorder, env)
