"""The workload catalog: trainable models with real data (see :mod:`.base`), and layer tables
of big models (:mod:`.catalog`).

Attributes load lazily so that importing a sub-module (e.g. the CLI's commands) does not
import torch.
"""

from typing import Any

__all__ = ["WORKLOADS", "Workload", "finish_metrics", "make_workload"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from dlcomm.workloads import trainable
        return getattr(trainable, name)
    raise AttributeError(f"module 'dlcomm.workloads' has no attribute {name!r}")
