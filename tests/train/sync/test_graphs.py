"""Communication graphs: shapes, degrees, connectivity, colourings, custom edge lists."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlcomm.errors import ConfigError
from dlcomm.train.sync.graphs import GRAPHS, make_graph, parse_edges


@given(st.integers(2, 40))
def test_ring_is_symmetric_with_two_neighbours(n):
    g = make_graph("ring", n)
    for i in range(n):
        assert g.in_neighbours(i) == g.out_neighbours(i)
        assert set(g.neighbours(i)) == {(i - 1) % n, (i + 1) % n} - {i}


def test_torus_2x4_and_3x3():
    g = make_graph("torus", 8)
    assert g.name == "torus2x4"
    assert g.neighbours(0) == (1, 3, 4)      # left/right on a ring of 4, up = down
    g = make_graph("torus", 9)
    assert g.name == "torus3x3" and len(g.neighbours(4)) == 4
    assert make_graph("torus", 8, rows="4").name == "torus4x2"
    with pytest.raises(ConfigError, match="must divide"):
        make_graph("torus", 8, rows="3")


@given(st.integers(2, 64))
def test_exponential_graph_degrees(n):
    g = make_graph("exp", n)
    hops = {1 << k for k in range(n.bit_length()) if (1 << k) < n}
    for i in range(n):
        assert set(g.out_neighbours(i)) == {(i + h) % n for h in hops} - {i}
        assert set(g.in_neighbours(i)) == {(i - h) % n for h in hops} - {i}
    assert g.strongly_connected()


def test_bipartite_and_colourings():
    assert make_graph("bipartite", 5).two_colouring() == [0, 1, 0, 1, 0]
    assert make_graph("ring", 8).two_colouring() == [0, 1] * 4
    assert make_graph("ring", 7).two_colouring() is None
    assert make_graph("exp", 8).two_colouring() is None
    assert make_graph("complete", 4).two_colouring() is None


def test_custom_edges_directed_and_undirected():
    g = make_graph("edges", 3, edges="0-1+1>2+2>0")
    assert g.edges == {(0, 1), (1, 0), (1, 2), (2, 0)}
    assert g.in_neighbours(0) == (1, 2) and g.out_neighbours(0) == (1,)
    assert g.neighbours(0) == (1, 2)


@pytest.mark.parametrize("text,message", [
    ("0-1+1>2", "not strongly connected"),       # nothing reaches 0 from 2
    ("0-3", "ranks must differ and lie in"),
    ("0-0", "ranks must differ"),
    ("a-b", "expected A-B or A>B"),
])
def test_bad_custom_graphs(text, message):
    with pytest.raises(ConfigError, match=message):
        make_graph("edges", 3, edges=text)


def test_unknown_graph_and_too_few_workers():
    with pytest.raises(ConfigError, match="unknown graph 'star'"):
        make_graph("star", 4)
    with pytest.raises(ConfigError, match=">= 2 workers"):
        make_graph("ring", 1)
    with pytest.raises(ConfigError, match="needs edges="):
        make_graph("edges", 3)
    assert set(GRAPHS.names()) >= {"ring", "torus", "exp", "edges", "complete", "bipartite"}
    assert parse_edges("0-1;1-2", 3) == {(0, 1), (1, 0), (1, 2), (2, 1)}
