"""The flow-level network of the simulator: patterns of flows on a topology, and how
concurrent collectives share it (max-min fairness on the topology's graph, with its routing).

1. Ranks sit on accelerators (``dlcomm.plan.commtime.place_ranks``: linear or random).
2. A *pattern* is every flow of one phase of one collective across all the groups that run
   it at once (e.g. the ring flows of all DP groups of pipeline stage 3). Its flows are
   routed by the planner's flow model (``dlcomm.plan.flows.route_matrix``: shortest-path
   ECMP as a fluid, dimension order on tori), giving the load L_P(e) that the pattern puts
   on every directed edge e per unit of rate (bytes/s of a weight-1 flow), and its hop
   count (the longest route). In-network aggregation flows go from each member to its
   first-hop switch and, when a group spans several switches, from each of those to a
   switch they all reach, aggregated there (one stream per switch and group).
3. Alone, a pattern runs at rate min_e c_e / L_P(e): its slowest flow sets the pace of a
   collective whose steps end together (this is also the lowest of its flows' max-min
   fair rates, which ``Pattern.flow_rates`` reports with their spread).
4. Concurrent collectives (a DP all-reduce under a pipeline transfer, several stages'
   tensor-parallel all-reduces) share links max-min fairly (Bertsekas & Gallager 6.5):
   every active collective is one variable whose flows all move at its rate, and the rates
   are progressive filling over the edges with load matrix [L_P1 ... L_Pk] (the planner's
   ``dlcomm.plan.flows.waterfill`` computes the same; a dense version serves the few
   collectives that run at once, and is tested against it). Edges with identical capacity
   and loads are merged first (exact: they state the same constraint), and rates are cached
   per set of active collectives.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan.flownet import FlowNet
from dlcomm.plan.flows import route_matrix, waterfill
from dlcomm.plan.simulate.algorithms import SWITCH, Phase
from dlcomm.plan.topology.base import Topology
from dlcomm.plan.topology.fattree import FatTree
from dlcomm.plan.topology.hxmesh import HxMesh
from dlcomm.plan.topology.torus import Torus

__all__ = ["Pattern", "SimNetwork", "Sharing", "FLOW_RATE_LIMIT", "progressive_filling"]

FLOW_RATE_LIMIT = 20_000   # patterns up to this many flows also report per-flow max-min rates


@dataclass(frozen=True, eq=False)
class Pattern:
    """Every flow of one phase of one collective, on the network."""

    key: Hashable
    edges: np.ndarray          # directed edge ids that carry load
    load: np.ndarray           # load on each per unit rate (sum of route fractions x weight)
    hops: int                  # links on the longest route
    flows: int
    rate_Bps: float            # alone: bytes/s of a weight-1 flow (min_e c_e / L_P(e))
    flow_rates: tuple[float, float, float] | None  # alone, per flow max-min: min, median, max

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"flows": self.flows, "hops": self.hops,
                               "edges": len(self.edges),
                               "rate_gbps": self.rate_Bps * 8 / 1e9}
        if self.flow_rates:
            out["flow_rate_gbps"] = dict(zip(("min", "median", "max"),
                                             (r * 8 / 1e9 for r in self.flow_rates)))
        return out


class SimNetwork:
    """A topology's graph as a flow network, with ranks placed on its accelerators."""

    def __init__(self, topology: Topology, where: np.ndarray) -> None:
        self.topology = topology
        self.graph = topology.graph()
        self.net = FlowNet.from_graph(self.graph)
        self.where = np.asarray(where, dtype=np.int64)             # accelerator of every rank
        self.node = self.net.node_ids([int(a) for a in where])   # node id of every rank
        self.cap_Bps = self.net.cap * 1e9 / 8
        self.patterns: dict[Hashable, Pattern] = {}

    def sharing(self, keys: Any) -> Sharing:
        """The max-min sharing of the patterns named by ``keys`` (each once, in a fixed
        order: the columns of the rate table)."""
        return Sharing([self.patterns[k] for k in sorted(set(keys), key=repr)], self.cap_Bps)

    def grid_coords(self) -> np.ndarray | None:
        """Integer grid coordinates of every accelerator where the topology is a grid:
        a torus (its coordinates), HammingMesh and HyperX (global column bx a + i, global
        row by b + j); None elsewhere."""
        topo = self.topology
        if isinstance(topo, Torus):
            return np.array([self.graph.nodes[i]["pos"][1:] for i in range(topo.accelerators)])
        if isinstance(topo, HxMesh):
            pos = np.array([self.graph.nodes[i]["pos"] for i in range(topo.accelerators)])
            return np.column_stack([pos[:, 1] * topo.a + pos[:, 3],
                                    pos[:, 2] * topo.b + pos[:, 4]])
        return None

    # -- patterns ------------------------------------------------------------------------
    def flows(self, key: Hashable, src: np.ndarray, dst: np.ndarray,
              weight: np.ndarray | None = None) -> Pattern:
        """The pattern of flows between ranks ``src[f] -> dst[f]`` (cached by ``key``)."""
        if key in self.patterns:
            return self.patterns[key]
        s, d = self.node[np.asarray(src)], self.node[np.asarray(dst)]
        w = np.ones(len(s)) if weight is None else np.asarray(weight, dtype=float)
        matrix = route_matrix(self.net, s, d)
        load = np.asarray(matrix @ w).ravel()
        hops = math.ceil(float(np.asarray(matrix.sum(axis=0)).max()) - 1e-9) if matrix.nnz else 0
        spread = None
        if 0 < len(s) <= FLOW_RATE_LIMIT and matrix.nnz:
            used = np.flatnonzero(np.diff(matrix.indptr) > 0)
            rates = waterfill(matrix[:, used], self.cap_Bps, np.ones(len(used)),
                              np.full(len(used), np.inf)) / w[used]
            spread = (float(rates.min()), float(np.median(rates)), float(rates.max()))
        return self._store(key, load, hops, len(s), spread)

    def phase(self, scope: Hashable, groups: np.ndarray, phase: Phase) -> Pattern:
        """The pattern of ``phase`` run by every group (rows of rank ids) at once."""
        key = (scope, phase.key)
        if key in self.patterns:
            return self.patterns[key]
        if (phase.src == SWITCH).any() or (phase.dst == SWITCH).any():
            return self._ina(key, groups, phase)
        src = groups[:, phase.src].ravel()
        dst = groups[:, phase.dst].ravel()
        return self.flows(key, src, dst, np.tile(phase.weight, len(groups)))

    def _ina(self, key: Hashable, groups: np.ndarray, phase: Phase) -> Pattern:
        topo = self.topology
        if not (isinstance(topo, FatTree) and topo.ina):
            raise ConfigError(f"in-network aggregation needs aggregating switches: use "
                              f"fattree:...,ina=1 (not {topo.spec})")
        up = float(phase.weight[phase.dst == SWITCH][0])
        down = float(phase.weight[phase.src == SWITCH][0])
        net, labels = self.net, self.net.labels
        leaf_of = {}
        us, vs, ws = [], [], []
        for row in groups:
            leaves = {}
            for rank in row:
                acc = int(self.node[rank])
                if acc not in leaf_of:
                    nbrs = list(self.graph.neighbors(labels[acc]))
                    leaf_of[acc] = net.index[nbrs[0]]
                leaf = leaf_of[acc]
                leaves[leaf] = True
                us += [acc, leaf]
                vs += [leaf, acc]
                ws += [up, down]
            if len(leaves) > 1:
                tops = set.intersection(*(set(self.graph.neighbors(labels[lf]))
                                          for lf in leaves))
                tops = {t for t in tops if not isinstance(t, (int, np.integer))}
                if not tops:
                    raise ConfigError("no switch joins the group's leaves for aggregation")
                top = net.index[min(tops, key=repr)]
                for leaf in leaves:
                    us += [leaf, top]
                    vs += [top, leaf]
                    ws += [up, down]
        e = net.edge_ids(np.array(us), np.array(vs))
        load = np.bincount(e, weights=np.array(ws), minlength=net.n_edges)
        levels = topo.clos.levels
        return self._store(key, load, 2 * levels, 2 * groups.size, None)

    def _store(self, key: Hashable, load: np.ndarray, hops: int, flows: int,
               spread: tuple[float, float, float] | None) -> Pattern:
        edges = np.flatnonzero(load > 0)
        rate = float((self.cap_Bps[edges] / load[edges]).min()) if len(edges) else math.inf
        pattern = Pattern(key, edges, load[edges], hops, flows, rate, spread)
        self.patterns[key] = pattern
        return pattern


class Sharing:
    """Max-min fair rates of concurrently active patterns (module docstring, step 4)."""

    def __init__(self, patterns: list[Pattern], cap_Bps: np.ndarray) -> None:
        self.keys = [p.key for p in patterns]
        self.column = {k: i for i, k in enumerate(self.keys)}
        rows = np.unique(np.concatenate([p.edges for p in patterns])) if patterns \
            else np.zeros(0, dtype=np.int64)
        dense = np.zeros((len(rows), len(patterns)))
        for j, p in enumerate(patterns):
            dense[np.searchsorted(rows, p.edges), j] = p.load
        table = np.unique(np.column_stack([cap_Bps[rows], dense]), axis=0) if len(rows) \
            else np.zeros((0, len(patterns) + 1))
        self.cap = table[:, 0]
        self.loads = table[:, 1:]
        self.isolated = {p.key: p.rate_Bps for p in patterns}
        self._cache: dict[tuple[tuple[int, int], ...], dict[int, float]] = {}
        self.solves = 0

    def rates(self, active: Counter) -> dict[Hashable, float]:
        """Rate (bytes/s of a weight-1 flow) of each active pattern; ``active`` counts the
        collectives of each pattern that run now (each one gets its own fair share)."""
        key = tuple(sorted((self.column[k], c) for k, c in active.items() if c > 0))
        rates = self.rates_of(key)
        return {self.keys[j]: rates[j] for j, _ in key}

    def rates_of(self, key: tuple[tuple[int, int], ...]) -> dict[int, float]:
        """:meth:`rates` by column: ``key`` is sorted (column, count) pairs."""
        hit = self._cache.get(key)
        if hit is None:
            if len(key) == 1 and key[0][1] == 1:
                hit = {key[0][0]: self.isolated[self.keys[key[0][0]]]}
            else:
                hit = self._solve(key)
            self._cache[key] = hit
        return hit

    def _solve(self, key: tuple[tuple[int, int], ...]) -> dict[int, float]:
        self.solves += 1
        cols = [j for j, _ in key]
        counts = np.array([c for _, c in key], dtype=float)
        block = self.loads[:, cols]
        live = (block > 0).any(axis=1)
        # c collectives of one pattern share as c columns of equal rate: one column with
        # c times the load, whose rate each of them gets
        rates = progressive_filling(block[live] * counts, self.cap[live])
        return {j: float(r) for j, r in zip(cols, rates)}


def progressive_filling(loads: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Max-min fair rates of the columns of ``loads`` (rows: constraints sum_j L_ij r_j <= c_i)
    by progressive filling: raise every unfrozen rate together until a row saturates, freeze
    the columns on it, repeat. Equal to ``dlcomm.plan.flows.waterfill`` with unit weights
    (tested); dense, for the few collectives that run at once."""
    k = loads.shape[1]
    rate = np.zeros(k)
    active = loads.any(axis=0)
    residual = cap.astype(float).copy()
    while active.any():
        weight = loads[:, active].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            level = np.where(weight > 0, residual / weight, np.inf)
        step = float(level.min())
        if not np.isfinite(step):
            break
        rate[active] += step
        residual -= weight * step
        hot = level <= step * (1 + 1e-12)
        active &= ~(loads[hot] > 0).any(axis=0)
    rate[~loads.any(axis=0)] = np.inf
    return rate
