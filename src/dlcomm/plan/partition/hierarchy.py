"""Hierarchical partitioning of a network over 2^k heterogeneous devices, and its baselines.

AccPar (docs/references.md) partitions recursively: the device list is split in two
halves, one type and one split ratio is chosen per layer for that split, and each half
repeats the search on its own part of every layer, down to single devices (7 levels for
128). Steps of :func:`plan`:

1. at a node (a slice of devices and a sub-problem, costs.SubProblem), split the slice in
   halves (``hierarchy="binary"``) or into its single devices (``"flat"``, one level with
   p sides, used to run plans on p local workers);
2. price every (layer, type) and every edge between the sides (costs.level_costs): compute
   at the sides' aggregate throughput, intra-layer all-reduces, transitions and joins,
   with shares that make the sides finish together (or equal shares for the baselines);
3. choose the types by exact dynamic programming (dp.solve) over the allowed types;
4. give each side its part of every layer (split by the chosen type and share) and recurse;
   identical subtrees (same devices, same sub-problem) are planned once;
5. evaluate bottom-up per layer: a leaf computes its part at its device's throughput; a node
   first moves the layer's inputs (transitions and joins into it, both sides at once),
   then each side runs its subtree and its share of the intra-layer all-reduce; the layer is
   done when the slower side is: ``T(l) = trans(l) + max_k (T_k(l) + intra_k(l))``. The
   iteration takes ``sum_l T_root(l)``, split along that critical path into compute and
   communication.

The DP at a node sees its sides as single devices of their aggregate throughput (AccPar's
top-down approximation); the evaluation of step 5 is exact for the model. With one level
the two coincide (a test checks it).

Memory: a device holds, for every layer, its part of the weights ``weight_copies`` times
(weights, gradients, optimizer state) and its part of the input activation (kept for
backward), at ``bytes_per_element``. If a searching scheme's plan does not fit, the search
is repeated with a penalty ``lambda x (a layer's share of the sides' memory)`` added to
every layer's cost; ``lambda`` grows geometrically (x4) from the plan's time until a plan
fits, then bisection finds the smallest that fits; ConfigError if none does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan.partition.costs import LevelCosts, Sides, SubProblem, layer_sizes, level_costs
from dlcomm.plan.partition.devices import Cluster
from dlcomm.plan.partition.dp import solve
from dlcomm.plan.partition.graph import PartitionGraph
from dlcomm.registry import Registry

__all__ = ["Scheme", "SCHEMES", "PlanOptions", "NodePlan", "LeafPlan", "Plan", "plan",
           "plan_scheme", "compare_schemes", "HEADLINE", "ABLATIONS"]


@dataclass(frozen=True)
class Scheme:
    name: str
    label: str
    balanced: bool                                   # heterogeneity-aware split ratio
    allowed: Callable[[PartitionGraph], np.ndarray]  # (N, 3) bool: types it may choose
    searches: bool                                   # chooses types by DP (else fixed)


SCHEMES: Registry[Scheme] = Registry("partition scheme")


def _scheme(name: str, label: str, balanced: bool, searches: bool, doc: str):
    def register(allowed: Callable[[PartitionGraph], np.ndarray]
                 ) -> Callable[[PartitionGraph], np.ndarray]:
        scheme = Scheme(name, label, balanced, allowed, searches)
        SCHEMES.register(name, doc)(lambda: scheme)
        return allowed
    return register


@_scheme("dp", "data parallel", False, False, "Data parallelism: type I everywhere, equal split")
def _dp(g: PartitionGraph) -> np.ndarray:
    return np.tile([True, False, False], (len(g), 1))


@_scheme("owt", "one weird trick", False, False,
         "Krizhevsky's one weird trick: conv type I, FC type II, equal split")
def _owt(g: PartitionGraph) -> np.ndarray:
    fc = g.arrays["is_linear"]
    return np.stack([~fc, fc, np.zeros(len(g), dtype=bool)], axis=1)


@_scheme("hypar", "HyPar", False, True, "HyPar: DP over types I and II, equal split")
def _hypar(g: PartitionGraph) -> np.ndarray:
    return np.tile([True, True, False], (len(g), 1))


@_scheme("accpar", "AccPar", True, True,
         "AccPar: DP over types I, II, III, heterogeneity-aware split ratio")
def _accpar(g: PartitionGraph) -> np.ndarray:
    return np.ones((len(g), 3), dtype=bool)


@_scheme("accpar-equal", "AccPar types, equal split", False, True,
         "Ablation: AccPar's three types with equal split")
def _accpar_equal(g: PartitionGraph) -> np.ndarray:
    return np.ones((len(g), 3), dtype=bool)


@_scheme("dp-balanced", "data parallel, balanced", True, False,
         "Ablation: data parallelism with the heterogeneity-aware ratio")
def _dp_balanced(g: PartitionGraph) -> np.ndarray:
    return _dp(g)


HEADLINE = ("dp", "owt", "hypar", "accpar")
ABLATIONS = ("accpar-equal", "dp-balanced")


@dataclass(frozen=True)
class PlanOptions:
    batch: int                       # samples per iteration over the whole cluster
    bytes_per_element: float = 2.0   # bf16 activations, weights and gradients
    weight_copies: float = 3.0       # weights, gradients, optimizer state (momentum)
    hierarchy: str = "binary"        # "binary" (AccPar, 2^k devices) or "flat" (one level)

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ConfigError(f"batch must be >= 1, got {self.batch}")
        if self.bytes_per_element <= 0 or self.weight_copies < 1:
            raise ConfigError("bytes per element must be > 0 and weight copies >= 1")
        if self.hierarchy not in ("binary", "flat"):
            raise ConfigError(f"hierarchy must be binary or flat, got {self.hierarchy!r}")


@dataclass(frozen=True)
class LeafPlan:
    """One device: it computes its part of every layer."""

    lo: int
    accelerator: str
    time: np.ndarray          # (N,) s per layer
    compute: np.ndarray       # (N,)
    comm: np.ndarray          # (N,) zeros
    memory_bytes: float
    memory_capacity: float
    bytes_moved: float = 0.0
    level: int = 0

    @property
    def memory_fraction(self) -> float:
        return self.memory_bytes / self.memory_capacity

    @property
    def worst_device(self) -> LeafPlan:
        return self


@dataclass(frozen=True)
class NodePlan:
    """One split: the types and shares chosen there, its children, and its evaluation."""

    lo: int
    hi: int
    level: int
    parts: tuple[tuple[int, int], ...]
    sides: Sides
    costs: LevelCosts = field(repr=False)
    types: np.ndarray = field(repr=False)        # (N,)
    shares: np.ndarray = field(repr=False)       # (N, p)
    children: tuple[NodePlan | LeafPlan, ...] = field(repr=False)
    objective: float                             # the DP's optimum at this node (s)
    trans: np.ndarray = field(repr=False)        # (N,) s, transitions and joins into layer l
    time: np.ndarray = field(repr=False)         # (N,) s per layer through this subtree
    compute: np.ndarray = field(repr=False)
    comm: np.ndarray = field(repr=False)
    bytes_moved: float = 0.0                     # bytes sent in this subtree per iteration
    worst_device: LeafPlan | None = None         # the fullest device's leaf


@dataclass(frozen=True)
class Plan:
    scheme: Scheme
    graph: PartitionGraph
    cluster: Cluster
    options: PlanOptions
    root: NodePlan
    memory_penalty: float = 0.0       # lambda used (s); 0 when memory did not bind

    @property
    def time_s(self) -> float:
        return float(self.root.time.sum())

    @property
    def compute_s(self) -> float:
        return float(self.root.compute.sum())

    @property
    def comm_s(self) -> float:
        return float(self.root.comm.sum())

    @property
    def fits(self) -> bool:
        worst = self.root.worst_device
        return worst is not None and worst.memory_fraction <= 1.0

    def levels(self) -> list[list[tuple[NodePlan, int]]]:
        """Distinct nodes per level with how many times each occurs (level 1 first)."""
        out: list[list[tuple[NodePlan, int]]] = []
        frontier: list[NodePlan | LeafPlan] = [self.root]
        while frontier and isinstance(frontier[0], NodePlan):
            counts: dict[int, list] = {}
            for node in frontier:
                assert isinstance(node, NodePlan)
                counts.setdefault(id(node), [node, 0])[1] += 1
            out.append([(node, count) for node, count in counts.values()])
            frontier = [c for node in frontier if isinstance(node, NodePlan)
                        for c in node.children]
        return out


class _Planner:
    def __init__(self, graph: PartitionGraph, cluster: Cluster, scheme: Scheme,
                 options: PlanOptions, penalty: float) -> None:
        self.graph, self.cluster, self.scheme, self.options = graph, cluster, scheme, options
        self.penalty = penalty
        self.allowed = scheme.allowed(graph)
        self.pairs = [(e.src, e.dst) for e in graph.edges]
        self.edge_dst = np.array([e.dst for e in graph.edges], dtype=int)
        self.memo: dict[tuple, NodePlan | LeafPlan] = {}

    def parts(self, lo: int, hi: int) -> list[tuple[int, int]]:
        if self.options.hierarchy == "flat":
            return [(i, i + 1) for i in range(lo, hi)]
        mid = (lo + hi) // 2
        return [(lo, mid), (mid, hi)]

    def leaf(self, lo: int, sub: SubProblem, level: int) -> LeafPlan:
        acc = self.cluster.accelerator(lo)
        s = layer_sizes(self.graph, sub)
        per_layer = (s["C"] + s["C_fold"]) / (acc.peak_flops * acc.efficiency)
        memory = self.options.bytes_per_element * float(np.sum(
            self.options.weight_copies * (s["W"] + s["fold_params"]) + s["F_in"]
            + s["act_fold"]))
        return LeafPlan(lo, acc.name, per_layer, per_layer, np.zeros(len(self.graph)),
                        memory, acc.memory_bytes, level=level)

    def node(self, lo: int, hi: int, sub: SubProblem, level: int) -> NodePlan | LeafPlan:
        key = (self.cluster.signature(lo, hi), sub.key())
        if key in self.memo:
            return self.memo[key]
        result = (self.leaf(lo, sub, level) if hi - lo == 1
                  else self._split(lo, hi, sub, level))
        self.memo[key] = result
        return result

    def _split(self, lo: int, hi: int, sub: SubProblem, level: int) -> NodePlan:
        g, opts = self.graph, self.options
        parts = self.parts(lo, hi)
        sides = self.cluster.sides(parts)
        costs = level_costs(g, sub, sides, balanced=self.scheme.balanced,
                            bytes_per_element=opts.bytes_per_element,
                            weight_copies=opts.weight_copies)
        unary = costs.unary
        if self.penalty:
            share = costs.memory / (sides.devices * sides.memory)
            unary = unary + self.penalty * share.max(-1)
        unary = np.where(self.allowed, unary, np.inf)
        solution = solve(unary, self.pairs, costs.edge_time)
        if not np.isfinite(solution.cost):
            raise ConfigError(f"no allowed partition at devices {lo}..{hi - 1}")
        types = np.array(solution.types, dtype=int)
        rows = np.arange(len(g))
        shares = costs.shares[rows, types]                          # (N, p)
        children = tuple(self.node(a, b, child, level + 1)
                         for (a, b), child in zip(parts, sub.children(types, shares)))

        # evaluation (step 5): transitions into each layer, then the slower side
        e_idx = np.arange(len(g.edges))
        src_t = types[[e.src for e in g.edges]] if g.edges else np.zeros(0, dtype=int)
        dst_t = types[self.edge_dst] if g.edges else np.zeros(0, dtype=int)
        trans = np.zeros(len(g))
        np.add.at(trans, self.edge_dst, costs.edge_time[e_idx, src_t, dst_t])
        intra = costs.intra[rows, types]                            # (N, p)
        side_time = np.stack([c.time for c in children], axis=1) + intra
        critical = side_time.argmax(1)
        child_compute = np.stack([c.compute for c in children], axis=1)
        child_comm = np.stack([c.comm for c in children], axis=1)
        time = trans + side_time[rows, critical]
        compute = child_compute[rows, critical]
        comm = trans + intra[rows, critical] + child_comm[rows, critical]
        moved = (costs.intra_bytes[rows, types].sum()
                 + costs.edge_sent[e_idx, src_t, dst_t].sum()
                 + sum(c.bytes_moved for c in children))
        worst = max((c.worst_device for c in children),
                    key=lambda leaf: leaf.memory_fraction if leaf else -1.0)
        return NodePlan(lo, hi, level, tuple(parts), sides, costs, types, shares, children,
                        solution.cost, trans, time, compute, comm, float(moved), worst)


def plan(graph: PartitionGraph, cluster: Cluster, scheme: Scheme | str,
         options: PlanOptions, penalty: float = 0.0) -> Plan:
    """Plan and evaluate one scheme (steps 1-5 of the module docstring), no memory search."""
    if isinstance(scheme, str):
        scheme = SCHEMES.get(scheme)()
    n = cluster.size
    if n < 2:
        raise ConfigError("partitioning needs at least 2 devices")
    if options.hierarchy == "binary" and n & (n - 1):
        raise ConfigError(f"the binary hierarchy needs 2^k devices, got {n} "
                          f"({cluster.spec()})")
    planner = _Planner(graph, cluster, scheme, options, penalty)
    root = planner.node(0, n, SubProblem.whole(len(graph), options.batch), 1)
    assert isinstance(root, NodePlan)
    return Plan(scheme, graph, cluster, options, root, penalty)


def plan_scheme(graph: PartitionGraph, cluster: Cluster, scheme: Scheme | str,
                options: PlanOptions, *, require_fit: bool = True) -> Plan:
    """Plan a scheme within device memory (module docstring, last paragraph).

    A fixed scheme (data parallel, OWT) is planned as it is; whether it fits is reported by
    ``Plan.fits``. A searching scheme raises the memory penalty until its plan fits, and
    raises ConfigError if no penalty makes it fit (``require_fit=False`` returns the
    unconstrained plan instead).
    """
    if isinstance(scheme, str):
        scheme = SCHEMES.get(scheme)()
    first = plan(graph, cluster, scheme, options)
    if first.fits or not scheme.searches:
        return first
    scale = max(first.time_s, 1e-12)
    best: Plan | None = None
    low, high = 0.0, scale
    attempt = first
    for _ in range(40):
        attempt = plan(graph, cluster, scheme, options, penalty=high)
        if attempt.fits:
            best = attempt
            break
        low, high = high, high * 4
    if best is None:
        if not require_fit:
            return first
        worst = attempt.root.worst_device
        assert worst is not None
        raise ConfigError(
            f"{graph.name} at batch {options.batch} does not fit on {cluster.spec()} with "
            f"{scheme.label}: even its most memory-frugal plan needs "
            f"{worst.memory_bytes / 2**30:.2f} GiB on a {worst.accelerator} with "
            f"{worst.memory_capacity / 2**30:.2f} GiB")
    for _ in range(24):
        mid = (low + high) / 2
        attempt = plan(graph, cluster, scheme, options, penalty=mid)
        if attempt.fits:
            high = mid
            if attempt.time_s < best.time_s:
                best = attempt
        else:
            low = mid
    return best


def compare_schemes(graph: PartitionGraph, cluster: Cluster, options: PlanOptions,
                    names: tuple[str, ...] = HEADLINE + ABLATIONS) -> dict[str, Plan]:
    """Plans of several schemes on the same network, cluster and batch."""
    return {name: plan_scheme(graph, cluster, name, options) for name in names}
