"""The alpha-beta models (docs/references.md: collective cost models), against hand-computed
values."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlcomm.plan import collectives as coll

A, B = 1e-6, 1e-9          # 1 us per message, 1 GB/s


def test_ring_allreduce_by_hand():
    # p = 4, n = 4 MB: 6 steps of 1 MB each
    assert coll.ring_allreduce(4, 4e6, A, B) == pytest.approx(6 * A + 6e6 * B)
    assert coll.ring_allreduce(4, 4e6, A, B, gamma=B) == pytest.approx(6 * A + 9e6 * B)
    assert coll.ring_allreduce(1, 4e6, A, B) == 0


def test_doubling_and_trees_by_hand():
    assert coll.recursive_doubling_allreduce(8, 1e6, A, B) == pytest.approx(3 * (A + 1e6 * B))
    assert coll.rabenseifner_allreduce(8, 8e6, A, B) == pytest.approx(6 * A + 14e6 * B)
    assert coll.binomial_allreduce(8, 1e6, A, B) == pytest.approx(6 * (A + 1e6 * B))
    assert coll.log2_steps(1) == 0 and coll.log2_steps(5) == 3


def test_rabenseifner_steps_equal_betas_is_rabenseifner():
    t = coll.rabenseifner_steps(16, 8e6, A, [B] * 4)
    assert t == pytest.approx(coll.rabenseifner_allreduce(16, 8e6, A, B))
    with pytest.raises(ValueError):
        coll.rabenseifner_steps(16, 8e6, A, [B] * 3)
    # a slow first round (the largest chunk) costs more than a slow last round
    slow_first = coll.rabenseifner_steps(16, 8e6, A, [2 * B, B, B, B])
    slow_last = coll.rabenseifner_steps(16, 8e6, A, [B, B, B, 2 * B])
    assert slow_first > slow_last


def test_torus_rings():
    # docs/references.md (torus): 2(p1+p2-2) a + 2(p1 p2 - 1)/(p1 p2) n b, k rings divide b by k
    t = coll.torus_allreduce([4, 8], 32e6, A, B)
    assert t == pytest.approx(2 * 10 * A + 2 * 31 / 32 * 32e6 * B)
    t4 = coll.torus_allreduce([4, 8], 32e6, A, B, rings=4)
    assert t4 == pytest.approx(2 * 10 * A + 2 * 31 / 32 * 32e6 * B / 4)
    # one dimension is the ring
    ring = coll.ring_allreduce(16, 1e6, A, B)
    assert coll.torus_allreduce([16], 1e6, A, B) == pytest.approx(ring)


def test_hierarchical_alltoall_ina_p2p():
    t = coll.hierarchical_allreduce(8, 4, 8e6, A, B, 4 * B)
    two_levels = coll.ring_allreduce(8, 8e6, A, B) + coll.ring_allreduce(4, 1e6, A, 4 * B)
    assert t == pytest.approx(two_levels)
    assert coll.alltoall_pairwise(4, 4e6, A, B) == pytest.approx(3 * A + 3e6 * B)
    # bounds: injection 1 GB/s, bisection 1 GB/s, p = 8 ranks of 1 MB
    assert coll.alltoall_lower_bound(8, 1e6, 1e9, 1e9) == pytest.approx(2e6 / 1e9)
    assert coll.ina_allreduce(1e6, A, B, levels=2) == pytest.approx(4 * A + 1e6 * B)
    assert coll.p2p(1e6, A, B) == pytest.approx(A + 1e-3)


def test_bus_bandwidth_of_a_ring_is_the_link_bandwidth():
    t = coll.ring_allreduce(64, 1e9, 0.0, B)
    assert coll.bus_bandwidth(64, 1e9, t) == pytest.approx(1 / B)
    assert coll.bus_bandwidth(4, 1e9, 0.0) == math.inf


def test_bad_input():
    with pytest.raises(ValueError):
        coll.ring_allreduce(0, 1, A, B)
    with pytest.raises(ValueError):
        coll.p2p(-1, A, B)
    with pytest.raises(ValueError):
        coll.torus_allreduce([4, 4], 1, A, B, rings=0)


@given(p=st.integers(2, 4096), n=st.floats(1, 1e10), alpha=st.floats(0, 1e-4),
       beta=st.floats(1e-12, 1e-8))
def test_ring_and_rabenseifner_share_the_bandwidth_term(p, n, alpha, beta):
    ring = coll.ring_allreduce(p, n, alpha, beta)
    rab = coll.rabenseifner_allreduce(p, n, alpha, beta)
    bw = 2 * (p - 1) / p * n * beta
    assert ring - 2 * (p - 1) * alpha == pytest.approx(bw, rel=1e-9)
    assert rab - 2 * coll.log2_steps(p) * alpha == pytest.approx(bw, rel=1e-9)
    # no all-reduce moves less than the bandwidth term; in-network aggregation halves it
    assert coll.ina_allreduce(n, 0, beta) <= bw * p / (2 * (p - 1)) * (1 + 1e-12)
