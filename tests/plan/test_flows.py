"""The flow model against hand-worked examples and a naive reference implementation."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.plan.flownet import FlowNet
from dlcomm.plan.flows import (
    alltoall_loads,
    alltoall_rate,
    concurrent_rate,
    edge_loads,
    max_min_rates,
    route_matrix,
)
from dlcomm.plan.topology import build_topology


def ring(n: int, cap: float = 10.0, symmetric: bool = True) -> nx.Graph:
    g = nx.Graph(translations=(n,)) if symmetric else nx.Graph()
    for i in range(n):
        g.add_node(i, kind="acc", pos=(i,))
    for i in range(n):
        g.add_edge(i, (i + 1) % n, capacity=cap)
    return g


def test_ecmp_splits_evenly_over_shortest_paths():
    loads = edge_loads(ring(4), [(0, 2)])
    assert loads == {(0, 1): 0.5, (1, 2): 0.5, (0, 3): 0.5, (3, 2): 0.5}


def test_max_min_by_hand():
    # 0->2 splits over both halves, 0->1 shares link 0->1 with half of it:
    # 1.5 t = 10 on 0->1 freezes both at 20/3; 1->3 then fills 1->2 to 10.
    rates = max_min_rates(ring(4), [(0, 2), (1, 3), (0, 1)])
    assert rates == pytest.approx([20 / 3, 40 / 3, 20 / 3])
    # weights and demands: a demand caps a flow, weights scale shares
    rates = max_min_rates(ring(4), [(0, 1, 1.0, 3.0), (0, 1, 2.0)])
    assert rates == pytest.approx([3.0, 7.0])
    assert max_min_rates(ring(4), [(2, 2, 1.0, 5.0)]) == pytest.approx([5.0])


def test_dumbbell_bottleneck_and_concurrent_rate():
    g = nx.Graph()
    for a in "abc":
        g.add_edge(a, "L", capacity=100.0)
        g.add_edge(a.upper(), "R", capacity=100.0)
    g.add_edge("L", "R", capacity=30.0)
    flows = [("a", "A"), ("b", "B"), ("c", "C"), ("a", "b")]
    assert max_min_rates(g, flows) == pytest.approx([10, 10, 10, 90])
    assert concurrent_rate(g, flows) == pytest.approx(10)


def test_unreachable_and_bad_flows():
    g = nx.Graph()
    g.add_edge(0, 1, capacity=1.0)
    g.add_edge(2, 3, capacity=1.0)
    with pytest.raises(ValueError, match="no path"):
        max_min_rates(g, [(0, 3)])
    with pytest.raises(ValueError, match="not in the graph"):
        max_min_rates(g, [(0, 9)])
    with pytest.raises(ValueError):
        max_min_rates(g, [(0, 1, -1.0)])


def test_alltoall_on_a_ring_by_hand():
    # 4-ring: per direction, one neighbour flow plus half of the opposite-node flow
    # on each of two links: load 2 per edge, so rate 5 with capacity 10
    assert alltoall_loads(FlowNet.from_graph(ring(4))) == pytest.approx(np.full(8, 2.0))
    assert alltoall_rate(ring(4)) == pytest.approx(5.0)


def reference_rates(graph, flows):
    """Textbook progressive filling on explicit per-flow path fractions."""
    net = FlowNet.from_graph(graph, use_symmetry=False)
    src = net.node_ids([f[0] for f in flows])
    dst = net.node_ids([f[1] for f in flows])
    a = route_matrix(net, src, dst).toarray()
    rate = np.zeros(len(flows))
    frozen = np.zeros(len(flows), bool)
    cap = net.cap.copy()
    while not frozen.all():
        load = a @ (~frozen)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where(load > 1e-12, (cap - a @ rate) / load, np.inf).min()
        rate[~frozen] += step
        full = (load > 1e-12) & (a @ rate >= cap - 1e-9)
        frozen |= (a[full] > 0).any(axis=0)
    return rate


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(4, 9), st.integers(1, 12))
def test_waterfill_matches_reference(seed, nodes, nflows):
    rng = np.random.default_rng(seed)
    g = nx.connected_watts_strogatz_graph(nodes, 2, 0.5, seed=seed)
    for u, v in g.edges:
        g.edges[u, v]["capacity"] = float(rng.integers(1, 5))
    flows = []
    while len(flows) < nflows:
        s, d = rng.integers(0, nodes, 2)
        if s != d:
            flows.append((int(s), int(d)))
    got = max_min_rates(g, flows)
    assert got == pytest.approx(reference_rates(g, flows), rel=1e-6)
    # max-min fair: feasible, and every flow crosses a full link where it is the fastest
    net = FlowNet.from_graph(g)
    a = route_matrix(net, net.node_ids([f[0] for f in flows]),
                     net.node_ids([f[1] for f in flows])).toarray()
    use = a @ got
    assert (use <= net.cap * (1 + 1e-9)).all()
    for f in range(len(flows)):
        on = np.flatnonzero((a[:, f] > 0) & (use >= net.cap * (1 - 1e-9)))
        assert any(got[f] >= got[a[e] > 0].max() * (1 - 1e-9) for e in on)


SMALL = ["fattree:n=64,radix=16", "fattree:n=60,taper=0.5,radix=16", "torus2d:x=4,y=6",
         "torus3d:x=2,y=4,z=4,ports=6", "hyperx2d:x=6,y=4,radix=8",
         "hxmesh:a=2,b=2,x=8,y=4,radix=8", "hxmesh:a=3,b=2,x=3,y=4",
         "dragonfly:g=4,radix=8,ports=1", "dragonfly:g=5,a=4,p=2,h=1,radix=8,ports=2"]


@pytest.mark.parametrize("spec", SMALL)
def test_symmetry_is_exact(spec):
    """Translations are automorphisms, and the symmetric shortcuts equal brute force."""
    topo = build_topology(spec)
    g = topo.graph()
    sym, plain = FlowNet.from_graph(g), FlowNet.from_graph(g, use_symmetry=False)
    assert sym.symmetry is not None
    s = sym.symmetry
    for k in range(len(s.tcols)):          # unit shift along each translated coordinate
        shift = np.zeros((sym.n_edges, len(s.tcols)), dtype=np.int64)
        shift[:, k] = 1
        u, v = s.translate(sym.src, shift), s.translate(sym.dst, shift)
        e = sym.edge_ids(u, v)
        assert (e >= 0).all()
        assert (sym.cap[e] == sym.cap).all() and (sym.order[e] == sym.order).all()
    assert alltoall_loads(sym) == pytest.approx(alltoall_loads(plain))
    rng = np.random.default_rng(1)
    src = np.arange(sym.n_acc)
    dst = rng.permutation(sym.n_acc)
    keep = src != dst
    a, b = route_matrix(sym, src[keep], dst[keep]), route_matrix(plain, src[keep], dst[keep])
    assert abs(a - b).max() < 1e-12
