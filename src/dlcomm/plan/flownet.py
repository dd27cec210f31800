"""A capacitated network graph in array form, with ECMP routing and optional symmetry.

:class:`FlowNet` turns a networkx graph (nodes; edges with ``capacity`` in Gb/s per
direction, optional ``order``) into numpy arrays of directed edges, so that routing and
max-min sharing (``dlcomm.plan.flows``) run vectorized on graphs of ~16k accelerators.

Routing is shortest-path ECMP as a fluid: a flow at node u towards d splits equally over
the *downhill* edges u->v with dist(v, d) = dist(u, d) - 1 (per-hop ECMP, as switches
hash). Edges carry an ``order`` (default 0); among the downhill edges only those of the
lowest order are used, which expresses dimension-order routing on tori (order = dimension)
and plain ECMP everywhere else. The downhill edges towards one destination form a *frame*
(distances, downhill CSR and split shares), computed by one BFS.

Symmetry. When the graph declares translations (graph attribute ``translations``: a
modulus per coordinate, 0 for fixed ones; node attribute ``pos``: integer coordinates, -1
where a node has none), every destination is a translate of a *representative*
accelerator (all translated coordinates 0), so one frame per representative serves every
destination: a flow s -> d is routed as tau(s) -> tau(d) in the frame of tau(d) and its
edges are translated back. Directed edges fall into orbits (classes) under the
translations; summed per class, the loads of the representative destinations give the
exact load of every edge for any translation-invariant demand (all-to-all).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

__all__ = ["FlowNet", "Symmetry", "Frame"]

_UNREACHED = np.iinfo(np.int32).max


@dataclass(eq=False)
class Symmetry:
    """Translations acting on integer node coordinates (see the module docstring)."""

    pos: np.ndarray        # (V, C) int64 coordinates, -1 = none
    moduli: np.ndarray     # (C,) modulus of each translated coordinate, 0 = fixed
    is_acc: np.ndarray     # (V,) bool

    def __post_init__(self) -> None:
        self.tcols = np.flatnonzero(self.moduli > 0)
        if self.pos.min() < -1:
            raise ValueError("node coordinates must be >= -1")
        for c in self.tcols:
            if self.pos[:, c].max() >= self.moduli[c]:
                raise ValueError(f"coordinate {c} exceeds its modulus {self.moduli[c]}")
        self.radix = self.pos.max(axis=0) + 2
        self.strides = np.cumprod(np.concatenate([[1], self.radix[:-1]])).astype(np.int64)
        size = int(np.prod(self.radix))
        if size > 50_000_000:
            raise ValueError("coordinate space too large for a lookup table")
        self.table = np.full(size, -1, dtype=np.int64)
        keys = self._keys(self.pos)
        if len(np.unique(keys)) != len(keys):
            raise ValueError("two nodes share coordinates")
        self.table[keys] = np.arange(len(self.pos))
        at_zero = (self.pos[:, self.tcols] == 0).all(axis=1)
        self.reps = np.flatnonzero(self.is_acc & at_zero)
        self.group_order = int(np.prod(self.moduli[self.tcols])) if len(self.tcols) else 1
        if len(self.reps) * self.group_order != int(self.is_acc.sum()):
            raise ValueError("translations do not act freely and transitively on "
                             "the accelerators' orbits")
        self.rep_slot = np.full(len(self.pos), -1, dtype=np.int64)
        self.rep_slot[self.reps] = np.arange(len(self.reps))

    def _keys(self, pos: np.ndarray) -> np.ndarray:
        return ((pos + 1) * self.strides).sum(axis=-1)

    def translate(self, nodes: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """Node ids of ``nodes[i]`` moved by ``shift[i]`` (one row per node, per tcol)."""
        p = self.pos[nodes].copy()
        for k, c in enumerate(self.tcols):
            has = p[:, c] >= 0
            p[has, c] = (p[has, c] + shift[has, k]) % self.moduli[c]
        out = self.table[self._keys(p)]
        if (out < 0).any():
            raise ValueError("translation leaves the node set: not an automorphism")
        return out

    def shift_to_rep(self, nodes: np.ndarray) -> np.ndarray:
        """The shift that moves each accelerator in ``nodes`` onto its representative."""
        return -self.pos[nodes][:, self.tcols]

    def edge_classes(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Orbit id of every directed edge under the translations."""
        pu, pv = self.pos[src].copy(), self.pos[dst].copy()
        for c in self.tcols:
            anchor = np.where(pu[:, c] >= 0, pu[:, c], pv[:, c])
            for p in (pu, pv):
                has = p[:, c] >= 0
                p[has, c] = (p[has, c] - anchor[has]) % self.moduli[c]
        _, cls = np.unique(np.hstack([pu, pv]), axis=0, return_inverse=True)
        return cls.ravel()


@dataclass(frozen=True, eq=False)
class Frame:
    """ECMP routing towards one destination: distances and the downhill edges."""

    dest: int
    dist: np.ndarray       # (V,) hops to dest, _UNREACHED if none
    indptr: np.ndarray     # (V+1,) CSR of downhill edges by source node
    edges: np.ndarray      # downhill edge ids, grouped by source node
    share: np.ndarray      # fraction of a node's flow on each of its downhill edges


@dataclass(eq=False)
class FlowNet:
    """Directed, capacitated edges of a graph as arrays; accelerators are nodes 0..N-1."""

    labels: list[Hashable]
    n_acc: int
    src: np.ndarray
    dst: np.ndarray
    cap: np.ndarray
    order: np.ndarray
    symmetry: Symmetry | None = None
    _frames: dict[int, Frame] = field(default_factory=dict, repr=False)
    _classes: np.ndarray | None = field(default=None, repr=False)

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_graph(cls, graph: Any, capacity: str = "capacity",
                   use_symmetry: bool = True) -> FlowNet:
        """Build from a networkx (Di/Multi)Graph. Nodes with ``kind == "acc"`` are the
        accelerators (all nodes if none is marked); parallel edges add capacities."""
        marked = [n for n, k in graph.nodes(data="kind") if k == "acc"]
        accs = sorted(marked, key=_sort_key) if marked else sorted(graph.nodes, key=_sort_key)
        acc_set = set(accs)
        labels = accs + [n for n in graph.nodes if n not in acc_set]
        index = {n: i for i, n in enumerate(labels)}
        pairs: dict[tuple[int, int], list[float]] = {}
        directed = graph.is_directed()
        for u, v, data in graph.edges(data=True):
            if capacity not in data:
                raise ValueError(f"edge {u!r}-{v!r} has no {capacity!r}")
            c, o = float(data[capacity]), int(data.get("order", 0))
            if c <= 0 or u == v:
                continue
            ends = [(index[u], index[v])] if directed else [(index[u], index[v]),
                                                            (index[v], index[u])]
            for key in ends:
                if key in pairs:
                    pairs[key][0] += c
                else:
                    pairs[key] = [c, o]
        keys = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
        src, dst = keys[:, 0], keys[:, 1]
        cap = np.array([pairs[(int(a), int(b))][0] for a, b in keys], dtype=float)
        order = np.array([pairs[(int(a), int(b))][1] for a, b in keys], dtype=np.int64)
        sym = None
        moduli = graph.graph.get("translations")
        if use_symmetry and moduli is not None:
            pos = np.array([graph.nodes[n]["pos"] for n in labels], dtype=np.int64)
            is_acc = np.zeros(len(labels), dtype=bool)
            is_acc[:len(accs)] = True
            sym = Symmetry(pos, np.asarray(moduli, dtype=np.int64), is_acc)
        return cls(labels, len(accs), src, dst, cap, order, sym)

    def __post_init__(self) -> None:
        v = len(self.labels)
        self.n_nodes = v
        self.indptr = np.searchsorted(self.src, np.arange(v + 1))
        self._keys = self.src * v + self.dst          # sorted, since edges are sorted
        rev = sp.csr_matrix((np.ones(len(self.src)), (self.dst, self.src)), shape=(v, v))
        self._reverse = rev                            # BFS on it gives dist(v -> d)
        self.index = {n: i for i, n in enumerate(self.labels)}

    @property
    def n_edges(self) -> int:
        return len(self.src)

    def node_ids(self, labels: Sequence[Hashable]) -> np.ndarray:
        try:
            return np.array([self.index[n] for n in labels], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"node {exc.args[0]!r} is not in the graph") from None

    def edge_ids(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Ids of directed edges u[i] -> v[i]; -1 where there is none."""
        key = u * self.n_nodes + v
        pos = np.searchsorted(self._keys, key)
        pos = np.minimum(pos, len(self._keys) - 1)
        return np.where(self._keys[pos] == key, pos, -1)

    def edge_classes(self) -> np.ndarray:
        """Orbit id per directed edge (each edge its own class without symmetry)."""
        if self._classes is None:
            self._classes = (self.symmetry.edge_classes(self.src, self.dst)
                             if self.symmetry is not None else np.arange(self.n_edges))
        return self._classes

    # -- routing frames ------------------------------------------------------------------
    def frames(self, dests: Sequence[int]) -> list[Frame]:
        """The ECMP frame towards each node in ``dests`` (cached)."""
        wanted = {int(d) for d in dests}
        missing = sorted(wanted - set(self._frames))
        if len(self._frames) + len(missing) > 4096 and self.symmetry is None:
            self._frames.clear()     # bound the cache; callers ask for <= 4096 at a time
            missing = sorted(wanted)
        for start in range(0, len(missing), 128):
            chunk = missing[start:start + 128]
            dist = csgraph.shortest_path(self._reverse, method="D", unweighted=True,
                                         indices=chunk)
            for d, row in zip(chunk, np.atleast_2d(dist)):
                self._frames[d] = self._frame(d, row)
        return [self._frames[int(d)] for d in dests]

    def _frame(self, dest: int, row: np.ndarray) -> Frame:
        dist = np.where(np.isfinite(row), row, _UNREACHED).astype(np.int64)
        ds, dd = dist[self.src], dist[self.dst]
        down = (dd != _UNREACHED) & (ds == dd + 1)
        best = np.full(self.n_nodes, np.iinfo(np.int64).max)
        np.minimum.at(best, self.src[down], self.order[down])
        keep = down & (self.order == best[self.src])
        edges = np.flatnonzero(keep)
        count = np.bincount(self.src[edges], minlength=self.n_nodes)
        indptr = np.concatenate([[0], np.cumsum(count)])
        return Frame(dest, dist, indptr, edges, 1.0 / count[self.src[edges]])

    def frame_for(self, dests: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(frame destination per flow, shift per flow or None) for destinations ``dests``."""
        if self.symmetry is None:
            return dests, None
        shift = self.symmetry.shift_to_rep(dests)
        return self.symmetry.translate(dests, shift), shift


def _sort_key(label: Hashable) -> tuple[int, Any]:
    return (0, label) if isinstance(label, (int, np.integer)) else (1, repr(label))
