"""Closed forms against the flow model and max-flow min-cuts (issue checks)."""

import numpy as np
import pytest

from dlcomm.plan import collectives as coll
from dlcomm.plan.bandwidth import (
    alltoall_gbps,
    bisection_flow_gbps,
    measure,
    mincut_gbps,
    permutation_gbps,
    ring_allreduce_flow,
)
from dlcomm.plan.commtime import _rate
from dlcomm.plan.flownet import FlowNet
from dlcomm.plan.topology import build_topology

CUTS = ["fattree:n=16,ports=1,radix=4", "fattree:n=128,radix=16",
        "fattree:n=60,taper=0.5,radix=16", "fattree:n=72,taper=0.75,radix=16",
        "torus2d:x=8,y=6", "torus2d:x=2,y=4", "torus3d:x=4,y=2,z=6,ports=6",
        "hxmesh:a=2,b=2,x=4,y=6", "hxmesh:a=2,b=2,x=16,y=2,radix=8",
        "hxmesh:a=3,b=1,x=4,y=2", "hyperx2d:x=6,y=4,radix=8",
        "dragonfly:g=4,radix=8,ports=1", "dragonfly:g=1,radix=16"]


@pytest.mark.parametrize("spec", CUTS)
def test_bisection_closed_form_is_the_min_cut(spec):
    t = build_topology(spec)
    low, high = t.bisection_halves()
    assert abs(len(low) - len(high)) <= t.accelerators // 10
    assert mincut_gbps(t.graph("switches"), low, high) == pytest.approx(t.bisection_gbps())


@pytest.mark.parametrize("spec", ["fattree:n=128,radix=16", "fattree:n=120,taper=0.5,radix=16",
                                  "fattree:n=1024", "torus2d:x=8,y=8", "torus2d:x=16,y=8",
                                  "torus3d:x=8,y=4,z=4,ports=6", "hxmesh:a=2,b=2,x=8,y=4"])
def test_bisection_closed_form_matches_flow_model(spec):
    t = build_topology(spec)
    net = FlowNet.from_graph(t.graph())
    flow = bisection_flow_gbps(net, *t.bisection_halves())
    assert flow == pytest.approx(t.bisection_gbps(), rel=0.05)


@pytest.mark.parametrize("spec,fraction", [("fattree:n=128,radix=16", 1.0),
                                           ("fattree:n=640,taper=0.5", 0.5),
                                           ("fattree:n=768,taper=0.75", 0.25)])
def test_fat_tree_alltoall_flow_matches_closed_form(spec, fraction):
    # all traffic but the own leaf's leaves it: inj * min(1, up/down * N / (N - m))
    t = build_topology(spec)
    n, m = t.accelerators, t.per_leaf
    closed = t.injection_gbps * min(1.0, fraction * (n - 1) / (n - m))
    flow = alltoall_gbps(FlowNet.from_graph(t.graph()))
    assert flow == pytest.approx(closed, rel=0.05)


@pytest.mark.parametrize("spec", ["torus2d:x=16,y=16", "torus2d:x=8,y=8",
                                  "torus3d:x=8,y=8,z=8,ports=6"])
def test_torus_alltoall_flow_meets_the_bisection_bound(spec):
    t = build_topology(spec)
    bound = 4 * t.bisection_gbps() / t.accelerators
    assert alltoall_gbps(FlowNet.from_graph(t.graph())) == pytest.approx(bound, rel=0.05)


def test_ring_allreduce_closed_form_matches_flow_model_on_torus_and_fat_tree():
    n, alpha = 256e6, 2e-6
    torus = build_topology("torus2d:x=8,y=8")
    net = FlowNet.from_graph(torus.graph())
    closed = {c.algorithm: c.seconds for c in torus.allreduce_candidates(n, alpha)}
    assert ring_allreduce_flow(net, torus.snake_ring(), n, alpha) == \
        pytest.approx(closed["ring"], rel=0.05)
    # both directions of both dimensions: four concurrent flows per accelerator,
    # each on its own link, is the closed form's beta / P
    grid = np.arange(64).reshape(8, 8)
    nbrs = [np.roll(grid, s, a).ravel() for a in (0, 1) for s in (-1, 1)]
    rate = _rate(net, np.tile(grid.ravel(), 4), np.concatenate(nbrs))
    flow_torus = coll.torus_allreduce([8, 8], n, alpha, 1 / rate, rings=4)
    assert flow_torus == pytest.approx(closed["torus-rings"], rel=0.05)
    for spec in ("fattree:n=64,radix=16", "fattree:n=60,taper=0.5,radix=16"):
        tree = build_topology(spec)
        net = FlowNet.from_graph(tree.graph("switches"))
        ring = {c.algorithm: c.seconds for c in tree.allreduce_candidates(n, alpha)}["ring"]
        order = range(tree.accelerators)
        assert ring_allreduce_flow(net, order, n, alpha) == pytest.approx(ring, rel=0.05)


def test_tapered_rabenseifner_rounds_match_flow_model():
    # the round whose partners sit on other leaves runs at the taper's share
    tree = build_topology("fattree:n=64,taper=0.5,radix=16")
    net = FlowNet.from_graph(tree.graph("switches"))
    ranks = np.arange(64)
    inj = tree.injection_gbps * 1e9 / 8
    up = tree.clos.leaf_up * tree.params.rate_gbps * 1e9 / 8
    for s in range(6):
        partner = ranks ^ (1 << s)
        worst = np.bincount(ranks // tree.per_leaf,
                            weights=partner // tree.per_leaf != ranks // tree.per_leaf).max()
        closed = min(inj, up / worst) if worst else inj
        assert _rate(net, ranks, partner) == pytest.approx(closed, rel=0.05)


@pytest.mark.parametrize("spec", ["fattree:n=64,taper=0.5,radix=16",
                                  "hxmesh:a=2,b=2,x=16,y=2,radix=8", "fattree:n=128,radix=16"])
def test_logical_graph_equals_per_switch_graph(spec):
    """Collapsing non-blocking fat trees into one node changes no flow-model result."""
    t = build_topology(spec)
    logical, full = FlowNet.from_graph(t.graph()), FlowNet.from_graph(t.graph("switches"))
    assert alltoall_gbps(logical) == pytest.approx(alltoall_gbps(full), rel=1e-6)
    assert permutation_gbps(logical, 2) == pytest.approx(permutation_gbps(full, 2), rel=1e-6)


def test_hxmesh_bandwidths_follow_the_board_size():
    """Cut bound = injection / a (the paper's argument); the routed all-to-all crosses an
    intermediate board for most pairs and gets about half of it."""
    for a, grid in ((2, 8), (4, 4)):
        t = build_topology(f"hxmesh:a={a},b={a},x={grid},y={grid}")
        bw = measure(t)
        assert bw.alltoall_bound_gbps_per_accel == pytest.approx(t.injection_gbps / a)
        assert 0.3 / a < bw.alltoall_gbps_per_accel / t.injection_gbps <= 1 / a
        assert bw.allreduce_gbps_per_accel > 0.9 * t.injection_gbps
        assert bw.allreduce_algorithm == "torus-rings"


def test_non_blocking_fat_tree_measures_full_injection():
    bw = measure(build_topology("fattree:n=128,radix=16"), permutations=2)
    assert bw.alltoall_gbps_per_accel == pytest.approx(1600)
    assert bw.permutation_gbps_per_accel == pytest.approx(1600)
    assert bw.permutation_min_gbps == pytest.approx(1600)
    assert bw.allreduce_gbps_per_accel == pytest.approx(1600, rel=0.02)


def test_in_network_aggregation_beats_host_allreduce():
    plain = build_topology("fattree:n=64,radix=16")
    ina = build_topology("fattree:n=64,radix=16,ina=1")
    assert ina.best_allreduce(1e9, 1e-6).algorithm == "ina"
    ratio = plain.best_allreduce(1e9, 1e-6).seconds / ina.best_allreduce(1e9, 1e-6).seconds
    assert ratio == pytest.approx(2 * 63 / 64, rel=0.01)
