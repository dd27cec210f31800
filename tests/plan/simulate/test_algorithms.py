"""Collectives as flows reproduce the alpha-beta closed forms on a non-blocking star."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.errors import ConfigError
from dlcomm.plan import collectives as coll
from dlcomm.plan.simulate.algorithms import (
    SWITCH,
    allgather_phases,
    allreduce_phases,
    alltoall_phases,
    grid_shape,
    ina_phases,
)
from dlcomm.plan.simulate.collective import ExchangeModel, host_candidates

from .conftest import RATE_BPS, dp_collectives, star

N = 48e6                     # bytes per rank
BETA = 1 / RATE_BPS
ALPHA = 2e-6


def alone(g: int, algorithm: str, alpha: float = ALPHA) -> float:
    net = star(g)
    return dp_collectives(net, g, algorithm, alpha).allreduce("dp", 0, N).alone_s(net)


@pytest.mark.parametrize("g", [2, 3, 4, 6, 8, 16])
def test_ring_on_a_star_is_the_closed_form(g: int) -> None:
    # 2(g-1) alpha + 2(g-1)/g n / B
    assert alone(g, "ring") == pytest.approx(coll.ring_allreduce(g, N, ALPHA, BETA), rel=1e-9)


@pytest.mark.parametrize("g", [2, 4, 8, 16])
def test_doubling_algorithms_on_a_star(g: int) -> None:
    assert alone(g, "halving-doubling") == pytest.approx(
        coll.rabenseifner_allreduce(g, N, ALPHA, BETA), rel=1e-9)
    assert alone(g, "doubling") == pytest.approx(
        coll.recursive_doubling_allreduce(g, N, ALPHA, BETA), rel=1e-9)


@pytest.mark.parametrize("g", [2, 5, 8, 12])
def test_tree_is_binomial_reduce_and_broadcast(g: int) -> None:
    assert alone(g, "tree") == pytest.approx(coll.binomial_allreduce(g, N, ALPHA, BETA),
                                             rel=1e-9)


@pytest.mark.parametrize("g", [4, 6, 12, 16])
def test_torus_rings_and_hierarchical(g: int) -> None:
    g1, g2 = grid_shape(g)
    # four rings at once, each on a quarter: every flow at B/4, i.e. beta 4/B per ring
    assert alone(g, "torus") == pytest.approx(
        coll.torus_allreduce([g1, g2], N, ALPHA, 4 * BETA, rings=4), rel=1e-9)
    h = 2
    assert alone(g, f"hierarchical:{h}") == pytest.approx(
        coll.hierarchical_allreduce(h, g // h, N, ALPHA, BETA, BETA), rel=1e-9)


def test_in_network_aggregation_is_s_over_b() -> None:
    net = star(8)
    hop = 3e-7
    coll_ = dp_collectives(net, 8, alpha=ALPHA, exchange=ExchangeModel("switch"))
    coll_.hop_latency_s = hop
    call = coll_.gradients("dp", 0, N)
    # n / B, plus one message through one switch level: up and down
    assert call.alone_s(net) == pytest.approx(N * BETA + ALPHA + 2 * hop, rel=1e-9)
    assert coll.ina_allreduce(N, 0.0, BETA) == pytest.approx(N * BETA)


@given(st.integers(2, 40), st.sampled_from(["ring", "tree", "torus", "allgather", "alltoall"]))
@settings(max_examples=60, deadline=None)
def test_every_member_sends_what_the_algorithm_must(g: int, name: str) -> None:
    """Bytes each member injects over a phase list (in units of n), from the phases alone."""
    if name == "torus" and grid_shape(g)[0] < 2:
        return
    phases = (allgather_phases(g) if name == "allgather" else alltoall_phases(g)
              if name == "alltoall" else allreduce_phases(name, g))
    sent = np.zeros(g)
    for ph in phases:
        np.add.at(sent, ph.src, ph.weight * ph.fraction)
    expected = {"ring": 2 * (g - 1) / g, "torus": 2 * (g - 1) / g, "allgather": g - 1,
                "alltoall": (g - 1) / g}
    if name == "tree":
        # a binomial tree: every member but the root sends n once up; the root sends n
        # to each child going down
        assert sent.sum() == pytest.approx(2 * (g - 1))
    else:
        assert sent == pytest.approx(np.full(g, expected[name]))


def test_sampled_alltoall_keeps_every_members_load() -> None:
    full = alltoall_phases(64)[0]
    sampled = alltoall_phases(64, groups=200, max_flows=200 * 64 * 8)[0]
    assert "sampled" in sampled.key and len(sampled.src) < len(full.src)
    for ph in (full, sampled):
        out = np.bincount(ph.src, weights=ph.weight, minlength=64)
        inn = np.bincount(ph.dst, weights=ph.weight, minlength=64)
        assert out == pytest.approx(np.full(64, 63.0)) and inn == pytest.approx(out)


def test_ina_phase_has_one_stream_each_way() -> None:
    (ph,) = ina_phases(4, up=0.25, down=0.5)
    assert (ph.dst[:4] == SWITCH).all() and (ph.src[4:] == SWITCH).all()
    assert ph.weight.tolist() == [0.25] * 4 + [0.5] * 4


def test_candidates_and_bad_names() -> None:
    assert host_candidates(8) == ["ring", "tree", "halving-doubling", "doubling", "torus",
                                  "hierarchical:2", "hierarchical:4", "rails:2", "rails:4"]
    assert "halving-doubling" not in host_candidates(6)
    assert "torus" not in host_candidates(7)
    with pytest.raises(ConfigError, match="power-of-two"):
        allreduce_phases("halving-doubling", 6)
    with pytest.raises(ConfigError, match="unknown all-reduce"):
        allreduce_phases("butterfly", 8)
    with pytest.raises(ConfigError, match="hierarchical:3"):
        allreduce_phases("hierarchical:3", 8)
    with pytest.raises(ConfigError, match="rails:3"):
        allreduce_phases("rails:3", 8)


def test_rails_keep_all_but_one_hop_of_h_inside_a_block() -> None:
    (phase,) = allreduce_phases("rails:4", 8)
    inside = (phase.src // 4) == (phase.dst // 4)
    assert phase.weight[inside] == pytest.approx(np.full(inside.sum(), 3 / 4))
    assert phase.weight[~inside] == pytest.approx(np.full((~inside).sum(), 1 / 4))
    assert ((phase.src % 4) == (phase.dst % 4))[~inside].all()      # same position: a rail
    assert [p.key for p in allreduce_phases("rails:8", 8)] == ["ring"]   # one block


@pytest.mark.parametrize("spec", ["torus2d:x=4,y=4", "hxmesh:a=2,b=2,x=2,y=2",
                                  "torus3d:x=2,y=4,z=2,ports=6"])
def test_torus_rings_follow_the_physical_grid(spec: str) -> None:
    """All accelerators of a torus or mesh all-reduce near full injection P r (the
    planner's torus-rings closed form), because the rings follow the physical grid."""
    from dlcomm.plan.simulate.collective import Collectives
    from dlcomm.plan.simulate.fluid import SimNetwork
    from dlcomm.plan.topology import build_topology
    from dlcomm.plan.traffic import Parallelism

    topo = build_topology(spec)
    n = topo.accelerators
    net = SimNetwork(topo, np.arange(n))
    coll_ = Collectives(net, Parallelism(dp=n), ExchangeModel(), "torus", 0.0, 0.0)
    assert coll_.layout("dp") is not None
    t = coll_.allreduce("dp", 0, N).alone_s(net)
    injection = topo.injection_gbps * 1e9 / 8
    assert t == pytest.approx(2 * (n - 1) / n * N / injection, rel=1e-9)


def test_block_algorithms_without_a_block_size_that_fits_say_so() -> None:
    for name in ("rails", "hierarchical"):
        with pytest.raises(ConfigError, match="no block size"):
            allreduce_phases(name, 7)
