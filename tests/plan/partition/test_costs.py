"""The per-level cost model against costs computed by hand on 2- and 3-layer networks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.plan.partition.costs import Sides, SubProblem, balance_shares, layer_sizes, level_costs
from dlcomm.plan.partition.graph import build_graph
from tests.plan.partition.tables import mlp, residual_mlp

B = 8
# two sides: side 1 three times as fast, with twice the bandwidth (bytes/s)
SIDES = Sides(flops=np.array([1000.0, 3000.0]), bandwidth=np.array([100.0, 200.0]),
              devices=np.array([1.0, 1.0]), memory=np.array([1e9, 1e9]))


def test_two_layer_mlp_by_hand():
    """fc0 4->6 (reads the input), fc1 6->3; one byte per element."""
    g = build_graph(mlp([4, 6, 3]))
    c = level_costs(g, SubProblem.whole(2, B), SIDES, bytes_per_element=1.0)
    # training FLOPs: fc0 needs no input gradient (2 x forward), fc1 3 x forward
    C0, C1 = 2 * (2 * 4 * 6) * B, 3 * (2 * 6 * 3) * B
    # intra-layer all-reduce, elements per side (p = 2: each side sends and receives n)
    intra = {(0, 0): 24, (0, 1): 6 * B, (0, 2): 0,        # |W|, |F_out|, no E_in for fc0
             (1, 0): 18, (1, 1): 3 * B, (1, 2): 6 * B}    # |W|, |F_out|, |E_in|
    for (layer, t), n in intra.items():
        assert c.intra_bytes[layer, t].tolist() == [n, n]
        assert c.intra[layer, t].tolist() == pytest.approx([n / 100, n / 200])
    # closed form of the split ratio for two sides: alpha = (C/P1 + c1 - c0)/(C/P0 + C/P1)
    for layer, C in ((0, C0), (1, C1)):
        for t in range(3):
            c0, c1 = intra[(layer, t)] / 100, intra[(layer, t)] / 200
            alpha = (C / 3000 + c1 - c0) / (C / 1000 + C / 3000)
            alpha = min(max(alpha, 0.0), 1.0)
            assert c.shares[layer, t] == pytest.approx([alpha, 1 - alpha])
            t0 = alpha * C / 1000 + c0
            t1 = (1 - alpha) * C / 3000 + c1
            assert c.unary[layer, t] == pytest.approx(max(t0, t1))
            if 0 < alpha < 1:
                assert t0 == pytest.approx(t1)   # both sides finish together
    # transition fc0 -> fc1 for types (I, II): tensor = fc1's input, 6 x B elements
    a, b = c.shares[0, 0, 0], c.shares[1, 1, 0]
    n = 6 * B
    recv0 = n * (b * (1 - a) + a * (1 - b))           # F rows->cols, E cols->rows
    recv1 = n * ((1 - b) * a + (1 - a) * b)
    assert c.edge_recv[0, 0, 1].tolist() == pytest.approx([recv0, recv1])
    assert c.edge_time[0, 0, 1] == pytest.approx(max(recv0 / 100, recv1 / 200))
    # (II, III) moves nothing: FULL output feeds a FULL input, FULL error comes back
    assert c.edge_time[0, 1, 2] == 0


def test_equal_split_baseline():
    g = build_graph(mlp([4, 6, 3]))
    c = level_costs(g, SubProblem.whole(2, B), SIDES, balanced=False, bytes_per_element=1.0)
    assert np.all(c.shares == 0.5)
    # I -> III with equal halves: each side gathers the half of F it lacks (0.5 |F|)
    assert c.edge_recv[0, 0, 2].tolist() == [0.5 * 6 * B] * 2


def test_three_layer_residual_by_hand():
    """fc2 joins fc0's output: the shortcut is priced output layout to output layout."""
    g = build_graph(residual_mlp())
    assert [(e.src, e.dst, e.kind) for e in g.edges] == [(0, 1, "input"), (1, 2, "input"),
                                                        (0, 2, "join")]
    c = level_costs(g, SubProblem.whole(3, B), SIDES, balanced=False, bytes_per_element=2.0)
    n = 6 * B * 2                                       # joined tensor, bytes
    # III (output split by columns) joined into I (rows): a quarter each way, both sides
    assert c.edge_recv[2, 2, 0].tolist() == [0.5 * n, 0.5 * n]
    # I into II (FULL output): gather the other half of F; the FULL error needs nothing back
    assert c.edge_recv[2, 0, 1].tolist() == [0.5 * n, 0.5 * n]
    assert c.edge_time[2, 1, 1] == 0 and c.edge_time[2, 2, 2] == 0


def test_sub_problem_children_split_the_chosen_dimension():
    sub = SubProblem.whole(3, 16)
    types = np.array([0, 1, 2])
    shares = np.array([[0.25, 0.75]] * 3)
    left, right = sub.children(types, shares)
    assert left.batch.tolist() == [4, 16, 16] and right.batch.tolist() == [12, 16, 16]
    assert left.fin.tolist() == [1, 0.25, 1] and left.fout.tolist() == [1, 1, 0.25]
    g = build_graph(mlp([4, 6, 3, 2]))
    s = layer_sizes(g, left)
    assert s["W"].tolist() == [24, 18 * 0.25, 6 * 0.25]
    assert s["F_in"].tolist() == [4 * 4, 6 * 16 * 0.25, 3 * 16]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 100.0), min_size=2, max_size=5).flatmap(
           lambda p: st.tuples(st.just(p), st.lists(st.floats(0.0, 5.0), min_size=len(p),
                                                    max_size=len(p)))),
       st.floats(1.0, 1000.0))
def test_balanced_sides_finish_together(case, split):
    flops, fixed = (np.array(x) for x in case)
    shares = balance_shares(np.array(split), fixed, flops)
    assert shares.sum() == pytest.approx(1.0) and (shares >= 0).all()
    finish = shares * split / flops + fixed
    busy = shares > 1e-12
    assert np.ptp(finish[busy]) == pytest.approx(0.0, abs=1e-9 * finish.max())
    # a side left out could not have finished earlier than the others even with nothing
    assert (fixed[~busy] >= finish[busy].max() - 1e-9).all()
