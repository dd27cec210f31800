"""The flow model: max-min fair rates of flows over a capacitated graph with ECMP routing.

Input: a networkx graph whose edges carry ``capacity`` (Gb/s, per direction; an
undirected edge is a full-duplex link) and flows ``(src, dst)``, ``(src, dst, weight)``
or ``(src, dst, weight, demand)``. Routing is shortest-path ECMP as a fluid (each hop
splits a flow equally over its shortest-path next hops; see ``dlcomm.plan.flownet``).

Max-min fairness by progressive filling (Bertsekas & Gallager, *Data Networks*, 6.5):

1. route every flow: a matrix A (edges x flows) of the fraction of each flow on each edge;
2. raise the rate of every unfrozen flow f in proportion to its weight w_f, until an edge
   saturates (sum_f A[e,f] r_f = c_e) or a flow reaches its demand;
3. freeze the flows that cross a saturated edge or met their demand; repeat from 2 until
   all flows are frozen.

Also here: the *concurrent* rate (the largest t such that every flow f can run at t w_f at
once: min over edges of c_e / sum_f A[e,f] w_f), which fixes the time of a collective step
in which all flows carry the same data, and the uniform all-to-all among all accelerators,
computed per destination (one BFS per destination, or per representative when the graph
declares translations) instead of per flow.

A flow from a node to itself gets its demand (inf without one). The simulator calls
``max_min_rates`` directly.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from dlcomm.plan.flownet import FlowNet

__all__ = ["FlowNet", "as_flownet", "route_matrix", "waterfill", "max_min_rates",
           "concurrent_rate", "edge_loads", "alltoall_loads", "alltoall_rate"]


def as_flownet(graph: Any) -> FlowNet:
    """A :class:`FlowNet` for ``graph`` (returned as is if it already is one)."""
    return graph if isinstance(graph, FlowNet) else FlowNet.from_graph(graph)


def _parse(net: FlowNet, flows: Iterable[Sequence[Any]]) -> tuple[np.ndarray, ...]:
    rows = [tuple(f) for f in flows]
    for f in rows:
        if not 2 <= len(f) <= 4:
            raise ValueError(f"a flow is (src, dst[, weight[, demand]]), got {f!r}")
    src = net.node_ids([f[0] for f in rows])
    dst = net.node_ids([f[1] for f in rows])
    weight = np.array([float(f[2]) if len(f) > 2 else 1.0 for f in rows])
    demand = np.array([float(f[3]) if len(f) > 3 else np.inf for f in rows])
    if (weight <= 0).any() or (demand < 0).any():
        raise ValueError("flow weights must be > 0 and demands >= 0")
    return src, dst, weight, demand


def route_matrix(net: FlowNet, src: np.ndarray, dst: np.ndarray) -> sp.csc_matrix:
    """A[e, f]: the fraction of flow f (src[f] -> dst[f], node ids) on directed edge e."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    n_flows, v = len(src), net.n_nodes
    live = np.flatnonzero(src != dst)
    frame_dest, shift = net.frame_for(dst[live])
    start = src[live] if shift is None else net.symmetry.translate(src[live], shift)
    uniq, inv = np.unique(frame_dest, return_inverse=True)
    per_batch = int(max(1, min(1024, 20_000_000 // max(v, 1))))
    rows, cols, vals = [], [], []
    for b0 in range(0, len(uniq), per_batch):
        frames = net.frames(uniq[b0:b0 + per_batch])
        sel = np.flatnonzero((inv >= b0) & (inv < b0 + per_batch))
        slot = inv[sel] - b0
        eoff = np.concatenate([[0], np.cumsum([len(f.edges) for f in frames])])
        indptr = np.concatenate([f.indptr[:-1] + eoff[i] for i, f in enumerate(frames)]
                                + [[eoff[-1]]])
        edges = np.concatenate([f.edges for f in frames])
        share = np.concatenate([f.share for f in frames])
        dist = np.concatenate([f.dist for f in frames])
        node = slot * v + start[sel]
        if (dist[node] == np.iinfo(np.int32).max).any():
            bad = sel[dist[node] == np.iinfo(np.int32).max][0]
            raise ValueError(f"no path from {net.labels[src[live][bad]]!r} "
                             f"to {net.labels[dst[live][bad]]!r}")
        fid, frac = sel, np.ones(len(sel))
        span = len(frames) * v
        while len(fid):
            lo = indptr[node]
            cnt = indptr[node + 1] - lo
            total = int(cnt.sum())
            if total == 0:
                break
            rep = np.repeat(np.arange(len(fid)), cnt)
            offs = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            at = lo[rep] + offs
            e, f2, fid2 = edges[at], frac[rep] * share[at], fid[rep]
            rows.append(_unshift(net, e, fid2, shift))
            cols.append(live[fid2])
            vals.append(f2)
            nxt = (node[rep] // v) * v + net.dst[e]
            keys, back = np.unique(fid2 * span + nxt, return_inverse=True)
            frac = np.bincount(back.ravel(), weights=f2)
            fid, node = keys // span, keys % span
    if not rows:
        return sp.csc_matrix((net.n_edges, n_flows))
    matrix = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                           shape=(net.n_edges, n_flows))
    return matrix.tocsc()


def _unshift(net: FlowNet, e: np.ndarray, fid: np.ndarray, shift: np.ndarray | None) -> np.ndarray:
    """Frame edges back to real edges (undo the translation of each flow's frame)."""
    if shift is None:
        return e
    back = -shift[fid]
    u = net.symmetry.translate(net.src[e], back)
    w = net.symmetry.translate(net.dst[e], back)
    real = net.edge_ids(u, w)
    if (real < 0).any():
        raise ValueError("declared translations are not automorphisms of the graph")
    return real


def waterfill(matrix: sp.csc_matrix, cap: np.ndarray, weight: np.ndarray,
              demand: np.ndarray) -> np.ndarray:
    """Weighted max-min fair rates by progressive filling (module docstring, steps 2-3).

    Event-driven: with every unfrozen flow f at rate w_f t, edge e saturates at the level
    t_e = (c_e - frozen load on e) / (active weight on e). Each round takes the lowest
    t_e (or flow demand d_f / w_f), freezes the flows of every edge at that level and
    updates only the edges those flows cross, so the work is about one pass over the
    matrix plus one scan of the edges per distinct rate level.
    """
    matrix = sp.csc_matrix(matrix)
    n_flows = matrix.shape[1]
    rate = np.zeros(n_flows)
    used = np.diff(matrix.indptr) > 0
    rate[~used] = demand[~used]
    active = used & (demand > 0)
    by_edge = matrix.tocsr()
    frozen_load = np.zeros(matrix.shape[0])
    act_weight = matrix @ np.where(active, weight, 0.0)
    tiny = 1e-12 * max(float(weight.max()) if n_flows else 1.0, 1.0)

    def levels(edges: np.ndarray) -> np.ndarray:
        w = act_weight[edges]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(w > tiny, (cap[edges] - frozen_load[edges]) / w, np.inf)

    level = levels(np.arange(matrix.shape[0]))
    dem_level = np.where(active, demand / weight, np.inf)
    dem_order = np.argsort(dem_level, kind="stable")
    dem_next = 0
    while active.any():
        while dem_next < n_flows and not active[dem_order[dem_next]]:
            dem_next += 1
        t_dem = dem_level[dem_order[dem_next]] if dem_next < n_flows else np.inf
        t_edge = float(level.min()) if len(level) else np.inf
        t = min(t_edge, t_dem)
        if not np.isfinite(t):
            raise ValueError("unbounded rate: a flow crosses no edge and has no demand")
        limit = t * (1 + 1e-12) + 1e-300
        if t_edge <= t_dem:
            hot = np.flatnonzero(level <= limit)
            flows = np.unique(by_edge[hot].indices)
        else:
            flows = dem_order[dem_next:][dem_level[dem_order[dem_next:]] <= limit]
        flows = flows[active[flows]]
        if len(flows) == 0:          # the edge's flows froze already: retire the edge
            level[hot] = np.inf
            continue
        rate[flows] = weight[flows] * t
        active[flows] = False
        part = matrix[:, flows]
        rows = part.indices
        share = part.data * np.repeat(weight[flows], np.diff(part.indptr))
        np.add.at(frozen_load, rows, share * t)
        np.add.at(act_weight, rows, -share)
        touched = np.unique(rows)
        level[touched] = levels(touched)
    return rate


def max_min_rates(graph: Any, flows: Iterable[Sequence[Any]]) -> np.ndarray:
    """Max-min fair rate (Gb/s) of every flow, in input order."""
    net = as_flownet(graph)
    src, dst, weight, demand = _parse(net, flows)
    matrix = route_matrix(net, src, dst)
    rate = waterfill(matrix, net.cap, weight, demand)
    rate[src == dst] = demand[src == dst]
    return rate


def concurrent_rate(graph: Any, flows: Iterable[Sequence[Any]]) -> float:
    """Largest t such that all flows run at once at t * weight (inf if no edge is used)."""
    net = as_flownet(graph)
    src, dst, weight, _ = _parse(net, flows)
    load = route_matrix(net, src, dst) @ weight
    used = load > 0
    return float((net.cap[used] / load[used]).min()) if used.any() else float("inf")


def edge_loads(graph: Any, flows: Iterable[Sequence[Any]]
               ) -> dict[tuple[Hashable, Hashable], float]:
    """Load of each used directed edge (u, v) when every flow runs at its weight."""
    net = as_flownet(graph)
    src, dst, weight, _ = _parse(net, flows)
    load = route_matrix(net, src, dst) @ weight
    return {(net.labels[net.src[e]], net.labels[net.dst[e]]): float(load[e])
            for e in np.flatnonzero(load)}


def alltoall_loads(net: FlowNet) -> np.ndarray:
    """Load of every directed edge when each accelerator sends 1 to every other one.

    Per destination d (a representative when the net is symmetric): every other
    accelerator injects 1, and nodes are visited from the farthest to d, each passing its
    accumulated flow on over its downhill edges. With symmetry the loads of the
    representatives are summed per edge class and spread over the class: an edge of class
    C carries |G|/|C| times the class total (|G| = number of translations).
    """
    if net.symmetry is not None:
        dests = net.symmetry.reps
    else:
        dests = np.arange(net.n_acc)
    total = np.zeros(net.n_edges)
    for b0 in range(0, len(dests), 1024):
        for frame in net.frames(dests[b0:b0 + 1024]):
            total += _accumulate(net, frame)
    if net.symmetry is None:
        return total
    cls = net.edge_classes()
    size = np.bincount(cls)
    return net.symmetry.group_order / size[cls] * np.bincount(cls, weights=total)[cls]


def _accumulate(net: FlowNet, frame: Any) -> np.ndarray:
    inflow = np.zeros(net.n_nodes)
    inflow[:net.n_acc] = 1.0
    inflow[frame.dest] = 0.0
    if (frame.dist[:net.n_acc] == np.iinfo(np.int32).max).any():
        raise ValueError(f"accelerators cannot reach {net.labels[frame.dest]!r}")
    load = np.zeros(net.n_edges)
    e = frame.edges
    level = frame.dist[net.src[e]]
    order = np.argsort(-level, kind="stable")
    e, level = e[order], level[order]
    share = frame.share[order]
    bounds = np.flatnonzero(np.diff(level)) + 1
    for chunk in np.split(np.arange(len(e)), bounds):
        ec = e[chunk]
        amount = inflow[net.src[ec]] * share[chunk]
        load[ec] = amount
        inflow += np.bincount(net.dst[ec], weights=amount, minlength=net.n_nodes)
    return load


def alltoall_rate(graph: Any) -> float:
    """Largest rate every accelerator pair can sustain at once in a uniform all-to-all."""
    net = as_flownet(graph)
    load = alltoall_loads(net)
    used = load > 0
    return float((net.cap[used] / load[used]).min())
