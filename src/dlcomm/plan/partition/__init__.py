"""Tensor partitioning over heterogeneous accelerators (AccPar, HPCA'20), planned and executed.

    from dlcomm.workloads.catalog import get_model
    from dlcomm.plan.partition import PlanOptions, build_graph, compare_schemes, make_cluster
    graph = build_graph(get_model("vgg19"))
    plans = compare_schemes(graph, make_cluster("tpu-v2:64,tpu-v3:64"), PlanOptions(batch=512))
    speedup = plans["dp"].time_s / plans["accpar"].time_s

Modules, one algorithm each (docs/partition.md has the model and its assumptions):

- layouts.py    partition types I/II/III, layouts, transitions and joins (AccPar)
- graph.py      a catalog layer table as conv/linear nodes with input and join edges
- costs.py      cost of every (layer, type) and edge at one split; the split-ratio closed form
- dp.py         exact dynamic programme over the layer graph (and brute force)
- devices.py    groups of accelerators, cluster files, bandwidth and throughput per side
- hierarchy.py  recursive binary partitioning, the schemes (DP, OWT, HyPar, AccPar), memory
- report.py     the ``kind: partition`` JSON, table and plot
- execute/      plans run for real on local gloo ranks, checked against one process and
                against the cost model's bytes
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PartType", "Layout", "build_graph", "PartitionGraph", "make_cluster", "Cluster",
           "PlanOptions", "SCHEMES", "plan", "plan_scheme", "compare_schemes", "Plan",
           "level_costs", "solve", "brute_force"]

_WHERE = {"PartType": "layouts", "Layout": "layouts", "build_graph": "graph",
          "PartitionGraph": "graph", "make_cluster": "devices", "Cluster": "devices",
          "PlanOptions": "hierarchy", "SCHEMES": "hierarchy", "plan": "hierarchy",
          "plan_scheme": "hierarchy", "compare_schemes": "hierarchy", "Plan": "hierarchy",
          "level_costs": "costs", "solve": "dp", "brute_force": "dp"}


def __getattr__(name: str) -> Any:
    """Import on first use, so that loading the CLI does not load numpy."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
