"""What the cost model says an executed plan moves: elements per rank, per edge and layer.

The same formulas the planner prices (layouts.transition / join_transition for edges,
costs.allreduce for the intra-layer sums), evaluated with the executed plan's integer
splits as shares (``split_k / dim``) and its integer all-reduce ownership, so a byte count
of the run can be compared element for element. Keys match comm.Comm's counters:
``edge<e>`` (forward F plus backward E of graph edge e) and ``intra<l>`` (layer l's sums).
"""

from __future__ import annotations

import numpy as np

from dlcomm.plan.partition.graph import PartitionGraph
from dlcomm.plan.partition.layouts import PartType, integer_split, join_transition, transition

__all__ = ["split_dims", "expected_elements"]


def split_dims(graph: PartitionGraph, types: list[int], batch: int) -> list[int]:
    """The size of the dimension each layer's type splits: B, C_in or C_out."""
    return [batch if t == PartType.I else (node.c_in if t == PartType.II else node.c_out)
            for node, t in zip(graph.nodes, types)]


def _allreduce(n: int, p: int) -> np.ndarray:
    own = np.array(integer_split(n, [1.0] * p), dtype=float)
    return (n - own) + (p - 1) * own


def expected_elements(graph: PartitionGraph, types: list[int], splits: list[list[int]],
                      batch: int) -> dict[str, tuple[list[int], list[int]]]:
    """``{key: (sent per rank, received per rank)}`` for one training step."""
    dims = split_dims(graph, types, batch)
    shares = [np.array(s, dtype=float) / d for s, d in zip(splits, dims)]
    p = len(splits[0])
    out: dict[str, tuple[list[int], list[int]]] = {}
    for e, edge in enumerate(graph.edges):
        move = join_transition if edge.kind == "join" else transition
        recv, sent = move(PartType(types[edge.src]), shares[edge.src],
                          PartType(types[edge.dst]), shares[edge.dst])
        elems = edge.elems * batch
        out[f"edge{e}"] = ([round(x * elems) for x in sent], [round(x * elems) for x in recv])
    for node, t in zip(graph.nodes, types):
        if t == PartType.I:
            n = node.params + node.fold_params
        elif t == PartType.II:
            n = node.out_elems * batch
        else:
            n = 0 if node.takes_input else node.in_elems * batch
        moved = [int(x) for x in _allreduce(n, p)] if n else [0] * p
        out[f"intra{node.index}"] = (moved, moved)
    return out
