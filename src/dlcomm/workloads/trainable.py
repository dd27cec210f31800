"""Import every trainable workload so that it registers itself in WORKLOADS."""

from dlcomm.workloads import digits as _digits  # noqa: F401  (registers digits-cnn)
from dlcomm.workloads import dlrm as _dlrm  # noqa: F401  (registers dlrm-synthetic)
from dlcomm.workloads import stdlib_lm as _stdlib_lm  # noqa: F401  (registers stdlib-lm)
from dlcomm.workloads import synthetic as _synthetic  # noqa: F401  (registers synthetic)
from dlcomm.workloads.base import WORKLOADS, Workload, finish_metrics, make_workload

__all__ = ["WORKLOADS", "Workload", "finish_metrics", "make_workload"]
