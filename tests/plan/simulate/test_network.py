"""The simulator's network: patterns on the planner's flow model, max-min sharing."""

from __future__ import annotations

from collections import Counter

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.errors import ConfigError
from dlcomm.plan.flownet import FlowNet
from dlcomm.plan.flows import concurrent_rate, max_min_rates, route_matrix
from dlcomm.plan.simulate.algorithms import allreduce_phases, ina_phases
from dlcomm.plan.simulate.fluid import Pattern, Sharing, SimNetwork
from dlcomm.plan.topology import build_topology

from .conftest import RATE_BPS, star


def _pattern(net: FlowNet, key: str, src: list[int], dst: list[int]) -> Pattern:
    matrix = route_matrix(net, np.array(src), np.array(dst))
    load = np.asarray(matrix @ np.ones(len(src))).ravel()
    edges = np.flatnonzero(load > 0)
    cap = net.cap * 1e9 / 8
    return Pattern(key, edges, load[edges], 1, len(src),
                   float((cap[edges] / load[edges]).min()), None)


@given(st.integers(5, 12), st.integers(0, 10_000), st.integers(2, 9))
@settings(max_examples=40, deadline=None)
def test_sharing_of_single_flows_is_max_min_fairness(n: int, seed: int, k: int) -> None:
    """With one flow per collective, the sharing is the planner's per-flow max-min."""
    rng = np.random.default_rng(seed)
    graph = nx.connected_watts_strogatz_graph(n, 4, 0.3, seed=seed)
    for u, v in graph.edges:
        graph.edges[u, v]["capacity"] = float(rng.integers(1, 5))
    flows = [tuple(rng.choice(n, 2, replace=False)) for _ in range(k)]
    net = FlowNet.from_graph(graph)
    ids = net.node_ids
    patterns = [_pattern(net, f"f{i}", list(ids([a])), list(ids([b])))
                for i, (a, b) in enumerate(flows)]
    shared = Sharing(patterns, net.cap * 1e9 / 8).rates(Counter(p.key for p in patterns))
    reference = max_min_rates(graph, flows) * 1e9 / 8
    assert [shared[p.key] for p in patterns] == pytest.approx(list(reference), rel=1e-9)


def test_a_collective_moves_at_its_slowest_flow() -> None:
    topo = build_topology("torus2d:x=4,y=4")
    net = SimNetwork(topo, np.arange(16))
    groups = np.arange(16).reshape(4, 4)[:, [0, 2, 1, 3]]      # rings that cross links
    (ph,) = allreduce_phases("ring", 4)
    pattern = net.phase(("dp", 0), groups, ph)
    src, dst = groups[:, ph.src].ravel(), groups[:, ph.dst].ravel()
    flows = list(zip(src.tolist(), dst.tolist()))
    assert pattern.rate_Bps == pytest.approx(concurrent_rate(topo.graph(), flows) * 1e9 / 8)
    assert pattern.flow_rates is not None
    assert pattern.rate_Bps == pytest.approx(pattern.flow_rates[0])
    assert pattern.flow_rates[2] >= pattern.flow_rates[0]


def test_concurrent_collectives_split_shared_links_fairly() -> None:
    net = star(4)
    groups = np.arange(4)[None, :]
    (ring,) = allreduce_phases("ring", 4)
    a = net.phase(("dp", 0), groups, ring)
    b = net.phase(("tp", 0), groups, ring)
    lone = net.flows("p2p", np.array([0]), np.array([1]))
    sharing = Sharing([a, b, lone], net.cap_Bps)
    assert sharing.rates(Counter({a.key: 1}))[a.key] == pytest.approx(RATE_BPS / 2)
    both = sharing.rates(Counter({a.key: 1, b.key: 1}))
    assert both[a.key] == pytest.approx(RATE_BPS / 4) and both[b.key] == pytest.approx(both[a.key])
    # the lone flow crosses links the rings saturate: all three at B/5 per flow weight
    three = sharing.rates(Counter({a.key: 1, b.key: 1, lone.key: 1}))
    assert three[lone.key] == pytest.approx(RATE_BPS / 5)
    # two collectives of one pattern: each its own share
    assert sharing.rates(Counter({a.key: 2}))[a.key] == pytest.approx(RATE_BPS / 4)
    assert len(sharing.cap) < net.net.n_edges            # identical links merged


def test_aggregation_on_a_tapered_tree_sends_one_stream_per_leaf_uplink() -> None:
    topo = build_topology("fattree:n=64,taper=0.5,ports=1,radix=16,ina=1")
    net = SimNetwork(topo, np.arange(topo.accelerators))
    m = topo.per_leaf
    groups = np.arange(topo.accelerators).reshape(m, -1).T       # one member per leaf each
    pattern = net.phase(("dp", 0), groups, ina_phases(groups.shape[1])[0])
    labels = net.net.labels
    up = [e for e in pattern.edges if isinstance(labels[net.net.src[e]], tuple)
          and labels[net.net.src[e]][0] == "leaf" and labels[net.net.dst[e]] == ("xbar",)]
    assert len(up) == topo.clos.leaves
    loads = pattern.load[np.isin(pattern.edges, up)]
    # every group sends one aggregated stream up each leaf's up-links (m groups per leaf)
    assert loads == pytest.approx(np.full(len(up), len(groups)))
    acc_up = topo.params.rate_gbps * 1e9 / 8
    leaf_up = topo.clos.leaf_up * acc_up
    assert pattern.rate_Bps == pytest.approx(min(acc_up, leaf_up / len(groups)))


def test_aggregation_needs_aggregating_switches() -> None:
    net = SimNetwork(build_topology("torus2d:x=2,y=2"), np.arange(4))
    with pytest.raises(ConfigError, match="ina=1"):
        net.phase(("dp", 0), np.arange(4)[None, :], ina_phases(4)[0])


@given(st.integers(1, 8), st.integers(1, 30), st.integers(0, 10_000))
@settings(max_examples=60, deadline=None)
def test_dense_progressive_filling_is_the_planners_waterfill(k: int, rows: int,
                                                             seed: int) -> None:
    import scipy.sparse as sp

    from dlcomm.plan.flows import waterfill
    from dlcomm.plan.simulate.fluid import progressive_filling

    rng = np.random.default_rng(seed)
    loads = rng.random((rows, k)) * (rng.random((rows, k)) < 0.5)
    loads[rng.integers(rows), :] += 0.1          # every column crosses some row
    cap = rng.random(rows) * 10 + 0.1
    expected = waterfill(sp.csc_matrix(loads), cap, np.ones(k), np.full(k, np.inf))
    assert progressive_filling(loads, cap) == pytest.approx(expected, rel=1e-9)
