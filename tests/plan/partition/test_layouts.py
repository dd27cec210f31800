"""Layouts and transitions against AccPar's tables (docs/references.md) and cell counting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.plan.partition.layouts import (
    IN_LAYOUT,
    OUT_LAYOUT,
    Layout,
    PartType,
    convert,
    equal_table,
    integer_split,
    join_transition,
    transition,
)

I, II, III = PartType.I, PartType.II, PartType.III
HALF = np.array([0.5, 0.5])

# AccPar (docs/references.md), transition previous -> current, as (share of |F|, share of |E|)
# one of two equal sides receives.
PAPER = {(I, I): (0, 0), (II, III): (0, 0), (III, II): (0, 0),
         (I, II): (0.25, 0.25), (III, I): (0.25, 0.25),
         (I, III): (0.5, 0), (III, III): (0.5, 0),
         (II, I): (0, 0.5), (II, II): (0, 0.5)}


@pytest.mark.parametrize(("prev", "cur"), sorted(PAPER))
def test_transition_table_is_the_papers(prev, cur):
    f = convert(OUT_LAYOUT[prev], HALF, IN_LAYOUT[cur], HALF)
    e = convert(IN_LAYOUT[cur], HALF, OUT_LAYOUT[prev], HALF)
    assert (f[0][0], e[0][0]) == PAPER[(prev, cur)]
    assert (f[0][1], e[0][1]) == PAPER[(prev, cur)]      # both sides alike
    assert transition(prev, HALF, cur, HALF)[0][0] == sum(PAPER[(prev, cur)])
    assert equal_table()[prev, cur] == sum(PAPER[(prev, cur)])


def test_join_table():
    # a shortcut converts output layout to output layout both ways: same type costs
    # nothing; I <-> III crosses dimensions (a quarter each way); to or from II's FULL
    # output one direction gathers half
    assert equal_table(join=True).tolist() == [[0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]]
    f, _ = join_transition(I, HALF, III, HALF)
    assert f.tolist() == [0.5, 0.5]


def test_heterogeneous_shares_move_what_is_missing():
    # I (batch 30/70) -> II (features 60/40): side 0 needs its 60% of the features for
    # the 70% of samples it lacks; E comes back across the same cut
    recv, sent = convert(Layout.ROWS, np.array([0.3, 0.7]), Layout.COLS, np.array([0.6, 0.4]))
    assert recv == pytest.approx([0.6 * 0.7, 0.4 * 0.3])
    assert sent == pytest.approx([0.3 * 0.4, 0.7 * 0.6])
    # same dimension, shifted boundary: only the sliver between 0.3 and 0.5 moves
    recv, sent = convert(Layout.ROWS, np.array([0.3, 0.7]), Layout.ROWS, np.array([0.5, 0.5]))
    assert recv == pytest.approx([0.2, 0.0])
    assert sent == pytest.approx([0.0, 0.2])


def _cells(layout: Layout, parts: list[int], rows: int, cols: int, k: int) -> set:
    lo, hi = sum(parts[:k]), sum(parts[:k + 1])
    if layout == Layout.FULL:
        return {(r, c) for r in range(rows) for c in range(cols)}
    if layout == Layout.ROWS:
        return {(r, c) for r in range(lo, hi) for c in range(cols)}
    return {(r, c) for r in range(rows) for c in range(lo, hi)}


def _parts(draw, n: int, p: int) -> list[int]:
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=p - 1, max_size=p - 1)))
    edges = [0, *cuts, n]
    return [b - a for a, b in zip(edges, edges[1:])]


@st.composite
def conversions(draw):
    rows, cols, p = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(2, 4))
    src, dst = draw(st.sampled_from(list(Layout))), draw(st.sampled_from(list(Layout)))
    src_parts = _parts(draw, rows if src == Layout.ROWS else cols, p)
    dst_parts = _parts(draw, rows if dst == Layout.ROWS else cols, p)
    return rows, cols, p, src, src_parts, dst, dst_parts


@settings(max_examples=300, deadline=None)
@given(conversions())
def test_convert_equals_counting_cells(case):
    """The closed forms equal an explicit count of cells needed, owned and sent."""
    rows, cols, p, src, src_parts, dst, dst_parts = case

    def shares(layout, parts):
        dim = rows if layout == Layout.ROWS else cols
        return np.array(parts, dtype=float) / dim

    recv, sent = convert(src, shares(src, src_parts), dst, shares(dst, dst_parts))
    for k in range(p):
        need = _cells(dst, dst_parts, rows, cols, k)
        own = _cells(src, src_parts, rows, cols, k)
        want_recv = 0 if src == Layout.FULL else len(need - own)
        want_sent = 0 if src == Layout.FULL else sum(
            len(_cells(dst, dst_parts, rows, cols, m) & own) for m in range(p) if m != k)
        assert recv[k] * rows * cols == pytest.approx(want_recv, abs=1e-9)
        assert sent[k] * rows * cols == pytest.approx(want_sent, abs=1e-9)
    assert recv.sum() == pytest.approx(sent.sum())


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 500), st.lists(st.floats(0.01, 10), min_size=1, max_size=5))
def test_integer_split(n, weights):
    parts = integer_split(n, weights)
    assert sum(parts) == n and len(parts) == len(weights)
    if n >= len(weights):
        assert min(parts) >= 1
    exact = np.array(weights) / sum(weights) * n
    if min(exact) >= 1:
        assert np.abs(np.array(parts) - exact).max() < 1 + 1e-9


def test_integer_split_rejects_nonsense():
    with pytest.raises(ValueError):
        integer_split(4, [])
    with pytest.raises(ValueError):
        integer_split(4, [0.0, 0.0])
