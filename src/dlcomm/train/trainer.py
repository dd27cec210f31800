"""Training one worker: the ``--sync`` protocol's loop on the ``--workload``.

Launch: ``dlcomm train --workload digits-cnn --workers 4 --exchange ring`` (this host), or
``torchrun --nproc-per-node 4 -m dlcomm worker --workload digits-cnn`` (any launcher).
:func:`train` looks the protocol up (``bsp``, the default, is DDP through an exchange;
``hop``, ``prague`` and ``adpsgd`` are decentralized; :mod:`dlcomm.train.sync`) and runs it.
"""

from __future__ import annotations

from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.common import WorkerReport
from dlcomm.train.config import TrainConfig
from dlcomm.train.sync import parse_sync
from dlcomm.workloads import Workload, make_workload

__all__ = ["train"]


def train(cfg: TrainConfig, env: WorkerEnv) -> tuple[Workload, list[WorkerReport] | None]:
    """Train ``cfg.workload`` on this worker; rank 0 gets every worker's report."""
    protocol = parse_sync(cfg.sync, env.world_size)
    workload = make_workload(cfg.workload, seed=cfg.seed)
    return workload, protocol.train(cfg, env, workload)
