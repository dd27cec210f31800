"""Bandwidth metrics of a topology: injection, bisection, all-to-all, permutation, all-reduce.

- injection: ports x link rate per accelerator (exact);
- bisection: the topology's closed form (exact for its natural cut; ``mincut_gbps``
  checks it with a max-flow min-cut on the per-switch graph of small instances, and
  ``bisection_flow_gbps`` with the flow model: each accelerator of one half exchanges
  with its counterpart in the other);
- all-to-all: flow model, every accelerator sends to every other at once with ECMP
  shortest-path routing; the rate every pair sustains, times N-1 (exact under the fluid
  model; computed per representative destination when the graph has translations).
  ``alltoall_bound`` is the cut bound min(injection, 4 B / N) the HammingMesh paper
  argues with;
- random permutation: max-min fair rates of the N flows of random permutations (fixed
  seed), averaged over flows and permutations (a sample of permutations);
- all-reduce: the fastest algorithm that suits the topology (``allreduce_candidates``:
  alpha-beta models with contention-aware betas), reported as NCCL bus bandwidth
  2(N-1)/N n / T at message size n.

All bandwidths in Gb/s, one direction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dlcomm.plan import collectives as coll
from dlcomm.plan.flownet import FlowNet
from dlcomm.plan.flows import alltoall_loads, route_matrix, waterfill
from dlcomm.plan.topology.base import Topology

__all__ = ["Bandwidth", "measure", "alltoall_gbps", "permutation_gbps", "mincut_gbps",
           "bisection_flow_gbps",
           "ring_allreduce_flow", "DEFAULT_ALLREDUCE_BYTES", "DEFAULT_ALPHA_S"]

DEFAULT_ALLREDUCE_BYTES = 1e9      # a 1 GB gradient (e.g. 500M parameters in fp16)
DEFAULT_ALPHA_S = 1e-6             # per-message latency: a hint, ~1 us per network step


@dataclass(frozen=True)
class Bandwidth:
    injection_gbps: float               # per accelerator
    bisection_gbps: float               # total across the cut, closed form
    alltoall_gbps_per_accel: float      # flow model
    alltoall_bound_gbps_per_accel: float  # cut bound: min(injection, 4 B / N)
    permutation_gbps_per_accel: float   # mean max-min rate of permutation flows
    permutation_min_gbps: float         # slowest permutation flow
    allreduce_gbps_per_accel: float     # bus bandwidth of the best algorithm
    allreduce_algorithm: str
    allreduce_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def alltoall_gbps(net: FlowNet) -> float:
    """Per-accelerator all-to-all throughput under the flow model (Gb/s)."""
    load = alltoall_loads(net)
    used = load > 0
    return float((net.cap[used] / load[used]).min()) * (net.n_acc - 1)


def permutation_gbps(net: FlowNet, samples: int = 1, seed: int = 0) -> tuple[float, float]:
    """(mean, min) max-min fair rate of the flows of ``samples`` random permutations."""
    rng = np.random.default_rng(seed)
    means, lows = [], []
    n = net.n_acc
    for _ in range(max(1, samples)):
        dst = rng.permutation(n)
        src = np.arange(n)
        moving = src != dst
        src, dst = src[moving], dst[moving]
        if len(src) == 0:
            continue
        rates = waterfill(route_matrix(net, src, dst), net.cap, np.ones(len(src)),
                          np.full(len(src), np.inf))
        means.append(float(rates.mean()))
        lows.append(float(rates.min()))
    return (float(np.mean(means)), float(min(lows))) if means else (np.inf, np.inf)


def mincut_gbps(graph: Any, side_a: Sequence[int], side_b: Sequence[int]) -> float:
    """Max-flow min-cut between two sets of accelerators (Gb/s, one direction)."""
    import networkx as nx

    flow = nx.DiGraph()
    for u, v, data in graph.edges(data=True):
        for a, b in ((u, v), (v, u)):
            flow.add_edge(a, b, capacity=data["capacity"])
    source, sink = ("source",), ("sink",)
    for node in side_a:
        flow.add_edge(source, node)            # no capacity attribute: unbounded
    for node in side_b:
        flow.add_edge(node, sink)
    return float(nx.maximum_flow_value(flow, source, sink))


def bisection_flow_gbps(net: FlowNet, side_a: Sequence[int], side_b: Sequence[int]) -> float:
    """Flow-model bisection: accelerator i of one half exchanges with accelerator i of the
    other (both directions at once); total rate across the cut in one direction."""
    a, b = net.node_ids(list(side_a)), net.node_ids(list(side_b))
    k = min(len(a), len(b))
    src, dst = np.concatenate([a[:k], b[:k]]), np.concatenate([b[:k], a[:k]])
    load = route_matrix(net, src, dst) @ np.ones(len(src))
    used = load > 0
    return float((net.cap[used] / load[used]).min()) * k


def ring_allreduce_flow(net: FlowNet, order: Sequence[int], nbytes: float, alpha: float,
                        directions: int = 1) -> float:
    """Ring all-reduce time from the flow model: each step every rank sends n/p to its
    ring successor (and, with ``directions=2``, half the data each way); the step lasts
    as long as the slowest of these concurrent flows needs."""
    order = np.asarray(order)
    p = len(order)
    src = np.concatenate([order, order][:directions])
    dst = np.concatenate([np.roll(order, -1), np.roll(order, 1)][:directions])
    load = route_matrix(net, src, dst) @ np.ones(len(src))
    used = load > 0
    rate = float((net.cap[used] / load[used]).min()) * 1e9 / 8      # bytes/s per flow
    return coll.ring_allreduce(p, nbytes, alpha, 1 / (directions * rate))


def measure(topo: Topology, *, nbytes: float = DEFAULT_ALLREDUCE_BYTES,
            alpha: float = DEFAULT_ALPHA_S, permutations: int = 1, seed: int = 0,
            net: FlowNet | None = None) -> Bandwidth:
    """Every metric of the module docstring for ``topo``."""
    net = net or FlowNet.from_graph(topo.graph())
    n = topo.accelerators
    bisection = topo.bisection_gbps()
    perm_mean, perm_min = permutation_gbps(net, permutations, seed)
    best = topo.best_allreduce(nbytes, alpha)
    busbw = coll.bus_bandwidth(n, nbytes, best.seconds) * 8 / 1e9
    return Bandwidth(topo.injection_gbps, bisection, alltoall_gbps(net),
                     min(topo.injection_gbps, 4 * bisection / n), perm_mean, perm_min,
                     busbw, best.algorithm, best.seconds)
