"""AD-PSGD's active/passive split and the passive server's bookkeeping."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlcomm.errors import ConfigError
from dlcomm.train.sync.adpsgd import PassiveBook, split_roles
from dlcomm.train.sync.graphs import make_graph


@given(st.integers(1, 20), st.sampled_from(["ring", "bipartite", "torus"]))
def test_actives_only_pair_with_passives(half, name):
    n = 2 * half if name != "bipartite" else half + 1
    if n < 2:
        return
    graph = make_graph(name, n)
    if graph.two_colouring() is None:
        with pytest.raises(ConfigError, match="needs a bipartite graph"):
            split_roles(graph)
        return
    roles = split_roles(graph)
    assert 0 in roles.active
    rng = random.Random(0)
    for rank in range(n):
        for partner in roles.partners[rank]:
            assert roles.is_active(rank) != roles.is_active(partner)   # never active-active
        if roles.is_active(rank):
            assert roles.choose(rank, rng) in roles.partners[rank]


def test_odd_ring_and_exponential_graph_are_refused():
    for name, n in (("ring", 7), ("exp", 8)):
        with pytest.raises(ConfigError, match="needs a bipartite graph"):
            split_roles(make_graph(name, n))


def test_passive_book_ends_when_every_active_neighbour_ended():
    book = PassiveBook(1, (0, 2))
    assert book.on_request(0, 10, 7) is False
    assert book.max_step_gap == 3 and book.requests == 1
    book.ending = True
    assert book.on_request(2, 7, 7) is True      # replies now carry the end
    book.on_end(0)
    assert book.stop_requested and not book.all_ended
    book.on_end(2)
    assert book.all_ended
    with pytest.raises(ValueError, match="not an active neighbour"):
        book.on_request(3, 0, 0)
