"""Hop's state machine: tokens, update queues, backup, staleness, skipping, finishing;
and, under random delays in the discrete-event simulation, the gap bound and no deadlock."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dlcomm.errors import ConfigError
from dlcomm.train.sync.graphs import Graph, make_graph
from dlcomm.train.sync.hop import HopOptions, HopWorker, mixing_weights
from dlcomm.train.sync.sim import simulate_hop


def worker(options=HopOptions(), rank=0, ins=(1, 2), outs=(1, 2)):
    return HopWorker(rank, ins, outs, options)


def test_tokens_bound_how_far_a_worker_runs_ahead():
    w = worker(HopOptions(max_gap=2))
    for k in range(2):                       # neighbours at 0: iterations 0 and 1 allowed
        start = w.try_start()
        assert start is not None and start.iteration == k
        w.on_update(1, k, "a")
        w.on_update(2, k, "b")
        assert w.ready_updates() == {1: "a", 2: "b"}
        assert w.complete() == k + 1
    assert w.try_start() is None             # 2 ahead of both: wait for a token
    w.on_token(1, 1)
    assert w.try_start() is None             # still 2 ahead of rank 2
    w.on_token(2, 3)
    assert w.try_start().iteration == 2
    assert w.max_gap_seen == {1: 2, 2: 2}


def test_exact_iteration_without_staleness_and_future_updates_kept():
    w = worker()
    w.on_update(1, 0, "a0")
    w.on_update(1, 1, "a1")                  # rank 1 is ahead: kept for iteration 1
    w.on_update(2, 0, "b0")
    w.try_start()
    assert w.ready_updates() == {1: "a0", 2: "b0"}
    w.complete()
    w.on_token(1, 1)
    w.on_token(2, 1)
    w.try_start()
    assert w.ready_updates() is None         # nothing from rank 2 for iteration 1
    w.on_update(2, 1, "b1")
    assert w.ready_updates() == {1: "a1", 2: "b1"}


def test_staleness_reuses_the_newest_update_within_bound():
    w = worker(HopOptions(max_gap=3, staleness=1), ins=(1,), outs=(1,))
    w.try_start()
    w.on_update(1, 0, "a0")
    assert w.ready_updates() == {1: "a0"}
    w.complete()
    w.try_start()                            # iteration 1: a0 is 1 old: still usable
    assert w.ready_updates() == {1: "a0"}
    w.complete()
    w.on_token(1, 1)
    w.try_start()                            # iteration 2: a0 is 2 old: wait
    assert w.ready_updates() is None
    w.on_update(1, 2, "a2")
    assert w.ready_updates() == {1: "a2"}


def test_backup_waits_for_the_fastest_and_weights_renormalise():
    w = worker(HopOptions(backup=1))
    w.try_start()
    assert w.ready_updates() is None
    w.on_update(2, 0, "b0")
    chosen = w.ready_updates()
    assert chosen == {2: "b0"}
    assert w.partial_iterations == 1
    weights = mixing_weights(0, chosen)
    assert weights == {0: 0.5, 2: 0.5} and sum(weights.values()) == 1.0
    assert sum(mixing_weights(0, {1: "a", 2: "b"}).values()) == pytest.approx(1.0)


def test_persistently_slow_worker_skips_to_the_token_limit():
    w = worker(HopOptions(max_gap=2, backup=1, skip=1))
    w.on_update(1, 1, "a1")
    w.on_update(1, 2, "a2")
    w.on_update(2, 2, "b2")
    w.on_token(1, 2)                          # both neighbours at the gap bound: blocked on us
    w.on_token(2, 2)
    start = w.try_start()                     # behind both: jump to min(2, 2) + 2 - 1
    assert (start.iteration, start.skipped) == (3, 3)
    assert start.catch_up == {1: "a2", 2: "b2"}       # the newest of each queue
    assert w.completed == 3 and w.skipped_iterations == 3 and w.jumps == 1
    assert all(len(q) == 0 for q in w.queues.values())  # stale entries dropped
    assert max(w.max_gap_seen.values()) <= 2
    w.on_update(1, 4, "a4")                   # rank 1 moved on past 3: its 4 stands in
    assert w.ready_updates() == {1: "a4"}
    assert w.complete() == 4


def test_skip_needs_a_persistent_lag():
    w = worker(HopOptions(max_gap=2, skip=2), ins=(1,), outs=(1,))
    w.on_token(1, 2)
    assert w.try_start().skipped == 0        # first time behind: no jump yet
    w.on_update(1, 0, "a")
    w.ready_updates()
    w.complete()
    w.on_token(1, 3)
    start = w.try_start()                    # second start in a row behind: jump
    assert start.skipped == 3 and start.iteration == 4


def test_finished_neighbours_are_dropped_and_end_the_run():
    w = worker()
    w.try_start()
    w.on_update(1, 0, "a0")
    assert w.ready_updates() is None
    w.on_finish(2, 0)
    assert w.stop_requested
    assert w.ready_updates() == {1: "a0"}
    w.complete()
    w.on_token(1, 3)
    assert w.try_start() is not None         # rank 2's count no longer binds


def test_bad_updates_and_options():
    w = worker()
    w.on_update(1, 3, "x")
    with pytest.raises(ValueError, match="must increase"):
        w.on_update(1, 3, "y")
    with pytest.raises(ConfigError, match="max_gap must be >= 1"):
        HopOptions(max_gap=0)
    with pytest.raises(ConfigError, match="backup=2 must be below the 2 in-neighbours"):
        worker(HopOptions(backup=2))


@st.composite
def graphs(draw):
    n = draw(st.integers(2, 9))
    kind = draw(st.sampled_from(["ring", "torus", "exp", "complete", "bipartite", "random"]))
    if kind != "random":
        return make_graph(kind, n)
    edges = {(i, (i + 1) % n) for i in range(n)} - {(0, 0)}   # a directed cycle ...
    extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=12))
    edges |= {(a, b) for a, b in extra if a != b}             # ... plus random chords
    return Graph("random", n, frozenset(e for e in edges if e[0] != e[1]))


@st.composite
def settings_(draw):
    graph = draw(graphs())
    degree = min(len(graph.in_neighbours(r)) for r in range(graph.n))
    options = HopOptions(max_gap=draw(st.integers(1, 4)),
                         backup=draw(st.integers(0, degree - 1)),
                         staleness=draw(st.integers(0, 2)), skip=draw(st.integers(0, 3)))
    slow = draw(st.lists(st.sampled_from([1.0, 1.0, 2.0, 4.0, 10.0]), min_size=graph.n,
                         max_size=graph.n))
    transient = draw(st.floats(0.0, 0.3))
    latency = draw(st.floats(1e-5, 5e-2))
    return graph, options, slow, transient, latency, draw(st.integers(0, 2**16))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(settings_())
def test_gap_bound_and_no_deadlock_under_random_delays(case):
    graph, options, slow, transient, latency, seed = case

    def compute(rank, rng):
        factor = slow[rank] * (5.0 if rng.random() < transient else 1.0)
        return 0.01 * factor * rng.uniform(0.5, 1.5)

    r = simulate_hop(graph, options, iterations=40, compute_s=compute,
                     latency_s=lambda rng: rng.uniform(0, latency), seed=seed)
    assert not r.deadlock
    assert r.violations == 0 and r.max_gap <= options.max_gap
    assert max(r.completed) >= 40            # the run ended because someone finished
    if not options.skip:
        assert r.skipped == [0] * graph.n


def test_skipping_lets_the_others_outrun_a_persistent_straggler():
    ring = make_graph("ring", 8)

    def compute(rank, rng):
        return (0.12 if rank == 3 else 0.03) * rng.uniform(0.9, 1.1)

    plain = simulate_hop(ring, HopOptions(max_gap=2, backup=1), 200, compute)
    skip = simulate_hop(ring, HopOptions(max_gap=2, backup=1, skip=1), 200, compute)
    assert max(skip.finish_time) < 0.5 * max(plain.finish_time)
    assert skip.skipped[3] > 0 and skip.max_gap <= 2 and plain.max_gap <= 2
