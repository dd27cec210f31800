"""The dynamic programme against brute force: random graphs and small real networks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.errors import ConfigError
from dlcomm.plan.partition.costs import Sides, SubProblem, level_costs
from dlcomm.plan.partition.dp import MAX_FRONTIER, assignment_cost, brute_force, solve
from dlcomm.plan.partition.graph import build_graph
from tests.plan.partition.tables import mlp, residual_mlp, tiny_resnet


@st.composite
def problems(draw):
    n = draw(st.integers(1, 7))
    pairs = [(i, i + 1) for i in range(n - 1)]
    if n > 2:
        extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))
                              .filter(lambda e: e[0] != e[1]), max_size=4))
        pairs += extra
    values = st.floats(0.0, 10.0, allow_nan=False)
    unary = np.array(draw(st.lists(st.lists(values, min_size=3, max_size=3), min_size=n,
                                   max_size=n)))
    mats = np.array(draw(st.lists(st.lists(values, min_size=9, max_size=9),
                                  min_size=len(pairs), max_size=len(pairs)))).reshape(-1, 3, 3)
    forbid = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 2)), max_size=3))
    for layer, t in forbid:
        unary[layer, t] = np.inf
    return unary, pairs, mats


@settings(max_examples=150, deadline=None)
@given(problems())
def test_dp_equals_brute_force(problem):
    unary, pairs, mats = problem
    best, dp = brute_force(unary, pairs, mats), solve(unary, pairs, mats)
    if np.isinf(best.cost):
        assert np.isinf(dp.cost)
        return
    assert dp.cost == pytest.approx(best.cost, rel=1e-12, abs=1e-12)
    assert assignment_cost(unary, pairs, mats, dp.types) == pytest.approx(dp.cost)


def test_chain_recurrence_by_hand():
    """Two layers: cost[1][t] = U[1,t] + min_t' (U[0,t'] + M[t',t])."""
    unary = np.array([[1.0, 5.0, 2.0], [4.0, 1.0, 9.0]])
    m = np.array([[0.0, 7.0, 3.0], [1.0, 0.0, 1.0], [2.0, 0.5, 0.0]])
    by_hand = min((unary[0, a] + m[a, b] + unary[1, b], (a, b))
                  for a in range(3) for b in range(3))
    sol = solve(unary, [(0, 1)], m[None])
    assert (sol.cost, sol.types) == (by_hand[0], by_hand[1]) == (3.5, (2, 1))


SIDES = Sides(np.array([45e12, 123e12]), np.array([62e9, 82e9]), np.array([1.0, 1.0]),
              np.array([16e9, 32e9]))


@pytest.mark.parametrize("table", [mlp([32, 64, 64, 16, 10]), residual_mlp(), tiny_resnet()],
                         ids=["mlp", "residual-mlp", "tiny-resnet"])
@pytest.mark.parametrize("balanced", [True, False])
def test_dp_equals_enumerating_every_assignment_of_a_network(table, balanced):
    """All 3^N type assignments of a small network, priced by the real cost model."""
    g = build_graph(table)
    c = level_costs(g, SubProblem.whole(len(g), 16), SIDES, balanced=balanced)
    pairs = [(e.src, e.dst) for e in g.edges]
    costs = {types: assignment_cost(c.unary, pairs, c.edge_time, types)
             for types in itertools.product(range(3), repeat=len(g))}
    best = min(costs.values())
    sol = solve(c.unary, pairs, c.edge_time)
    assert sol.cost == pytest.approx(best, rel=1e-12)
    assert costs[sol.types] == pytest.approx(best, rel=1e-12)
    # HyPar's restriction (types I, II) is the same search with III priced at infinity
    hypar = solve(np.where([True, True, False], c.unary, np.inf), pairs, c.edge_time)
    assert hypar.cost == pytest.approx(min(v for k, v in costs.items() if 2 not in k))


def test_too_wide_graphs_are_refused():
    n = MAX_FRONTIER + 3
    pairs = [(0, j) for j in range(1, n)] + [(i, n - 1) for i in range(1, n - 1)]
    with pytest.raises(ConfigError, match="too wide"):
        solve(np.zeros((n, 3)), pairs, np.zeros((len(pairs), 3, 3)))
