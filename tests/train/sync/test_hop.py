"""Hop's state machine: tokens, update queues, backup, staleness, skipping, finishing;
and, under random delays in the discrete-event simulation, the gap bound and no deadlock."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcomm.errors import ConfigError
from dlcomm.train.sync import check_sync, parse_sync
from dlcomm.train.sync.graphs import Graph, make_graph
from dlcomm.train.sync.hop import HopOptions, HopWorker, mixing_weights
from dlcomm.train.sync.sim import simulate_hop

# The mechanism tests below use plain lock-step Hop (the old defaults), so that each one
# sees only the knob it is about.
PLAIN = HopOptions(max_gap=2, backup=0, staleness=0, skip=0, reuse=1)


def plain(**changes):
    return replace(PLAIN, **changes)


def worker(options=PLAIN, rank=0, ins=(1, 2), outs=(1, 2)):
    return HopWorker(rank, ins, outs, options)


def test_tokens_bound_how_far_a_worker_runs_ahead():
    w = worker(plain(max_gap=2))
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
    w = worker(plain(max_gap=3, staleness=1), ins=(1,), outs=(1,))
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
    w = worker(plain(backup=1))
    w.try_start()
    assert w.ready_updates() is None
    w.on_update(2, 0, "b0")
    chosen = w.ready_updates()
    assert chosen == {2: "b0"}
    assert w.partial_iterations == 1
    weights = mixing_weights(0, chosen)
    assert weights == {0: 0.5, 2: 0.5} and sum(weights.values()) == 1.0
    assert sum(mixing_weights(0, {1: "a", 2: "b"}).values()) == pytest.approx(1.0)


def test_persistently_slow_worker_skips_level_with_its_furthest_neighbour():
    w = worker(plain(max_gap=4, backup=1, skip=1))
    w.on_update(1, 1, "a1")
    w.on_update(1, 2, "a2")
    w.on_update(2, 1, "b1")
    w.on_update(2, 2, "b2")
    w.on_token(1, 3)                          # both neighbours ahead of us (at 0)
    w.on_token(2, 2)
    start = w.try_start()                     # behind both: jump to max(3, 2) = 3, not to
    assert (start.iteration, start.skipped) == (3, 3)    # the token limit 2 + 4 - 1 = 5
    assert w.completed <= max(w.known.values())           # nobody now sees us ahead of it
    assert start.catch_up == {1: "a2", 2: "b2"}       # the newest of each queue
    assert w.completed == 3 and w.skipped_iterations == 3 and w.jumps == 1
    assert all(len(q) == 0 for q in w.queues.values())  # stale entries dropped
    assert max(w.max_gap_seen.values()) <= 4
    w.on_update(1, 4, "a4")                   # rank 1 moved on past 3: its 4 stands in
    assert w.ready_updates() == {1: "a4"}
    assert w.complete() == 4


def test_skip_needs_a_persistent_lag():
    w = worker(plain(max_gap=2, staleness=2, skip=2), ins=(1,), outs=(1,))
    w.on_token(1, 2)
    assert w.try_start().skipped == 0        # first time behind: no jump yet
    w.on_update(1, 0, "a")
    w.ready_updates()
    w.complete()
    w.on_token(1, 3)
    start = w.try_start()                    # second start in a row behind: jump level
    assert start.skipped == 2 and start.iteration == 3


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
        worker(plain(backup=2))


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
    backup = draw(st.integers(0, degree - 1))
    staleness = draw(st.integers(0, 4))
    skip = draw(st.integers(0, 3)) if backup or staleness else 0   # else it cannot trigger
    options = draw(st.sampled_from([HopOptions(), HopOptions(
        max_gap=draw(st.integers(1, 5)), backup=backup, staleness=staleness, skip=skip)]))
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

    plain = simulate_hop(ring, HopOptions(max_gap=4, backup=1, staleness=0, skip=0), 200,
                         compute)
    skip = simulate_hop(ring, HopOptions(max_gap=4, backup=1, staleness=0, skip=1), 200,
                        compute)
    assert max(skip.finish_time) < 0.5 * max(plain.finish_time)
    assert skip.skipped[3] > 0 and skip.max_gap <= 4 and plain.max_gap <= 4


# ---- the defaults tolerate a straggler (hop.py, "Defaults") ------------------------------

def test_skip_without_backup_or_staleness_is_refused():
    """With backup=0 and staleness=0 every out-neighbour needs this worker's update of
    exactly its own iteration, so none is ever ahead of it at a start: skip=T would be a
    silent no-op (it was: `hop:skip=1` ran exactly like `hop`)."""
    with pytest.raises(ConfigError, match="skip=1 can never trigger with backup=0 and "
                                          "staleness=0"):
        HopOptions(staleness=0)
    with pytest.raises(ConfigError, match="can never trigger"):
        check_sync("hop:max_gap=2,staleness=0,skip=2", 8)
    for spec in ("hop:staleness=0,skip=0", "hop:staleness=0,backup=1", "hop:backup=1"):
        check_sync(spec, 8)


def test_default_spec_is_the_straggler_tolerant_options_on_any_world():
    for world in (2, 3, 8):                              # no in-degree above 1 needed
        hop = parse_sync("hop", world)
        assert hop.options == HopOptions() and hop.graph.name == "ring"
    d = HopOptions()
    assert d.skip >= 1 and d.staleness >= d.max_gap - 1 and d.max_gap >= 4


def test_default_staleness_goes_on_without_a_lagging_neighbour_and_uses_each_update_once():
    """Rank 1 is slow; with the defaults this worker runs 4 iterations (the tokens' limit)
    without waiting for it (before: waited for rank 1's update of each iteration), averages
    rank 1's model a0 in once, not again in every iteration while it is within staleness
    (reuse=1, which dragged the fast workers back to an old model), and takes rank 1's late
    update a1 when it comes (with backup=1, staleness=0 it would have been dropped)."""
    w = worker(HopOptions())
    w.on_update(1, 0, "a0")
    mixed = []
    for k in range(4):
        start = w.try_start()
        assert start is not None and (start.iteration, start.skipped) == (k, 0)
        w.on_update(2, k, f"b{k}")
        if k == 3:
            w.on_update(1, 1, "a1")                      # rank 1's iteration 1, two late
        mixed.append(w.ready_updates())
        w.on_token(2, w.complete())
    assert mixed == [{1: "a0", 2: "b0"}, {2: "b1"}, {2: "b2"}, {1: "a1", 2: "b3"}]
    assert w.partial_iterations == 0 and w.already_used == 2
    assert w.try_start() is None                         # 4 ahead of rank 1: tokens bind


def test_reuse_averages_an_update_in_again_while_within_staleness():
    w = worker(HopOptions(reuse=1))
    w.on_update(1, 0, "a0")
    for k in range(3):
        w.try_start()
        w.on_update(2, k, f"b{k}")
        assert w.ready_updates() == {1: "a0", 2: f"b{k}"}
        w.on_token(2, w.complete())
    assert w.already_used == 0
    with pytest.raises(ConfigError, match="reuse must be 0 or 1"):
        HopOptions(reuse=2)


def test_a_jump_does_not_average_in_an_update_already_used():
    w = worker(HopOptions())
    w.try_start()
    w.on_update(1, 0, "a0")
    w.on_update(2, 0, "b0")
    assert w.ready_updates() == {1: "a0", 2: "b0"}
    w.complete()
    for tag in (1, 2, 3):
        w.on_update(2, tag, f"b{tag}")
    w.on_token(1, 4)
    w.on_token(2, 4)
    start = w.try_start()                                # behind both: jump level, to 4
    assert (start.iteration, start.skipped) == (4, 3)
    assert start.catch_up == {2: "b3"}                   # a0 was averaged in already
    assert w.ready_updates() is None                     # nothing from rank 1 in [1, 4]
    w.on_update(1, 4, "a4")
    assert w.ready_updates() == {1: "a4"}                # b3: in the catch-up already


def fast_rate(graph, options, slow_rank, factor, seed=0):
    def compute(rank, rng):
        return (factor if rank == slow_rank else 1.0) * 0.03 * rng.uniform(0.9, 1.1)

    r = simulate_hop(graph, options, 200, compute, seed=seed)
    assert not r.deadlock and r.violations == 0 and r.max_gap <= options.max_gap
    fast = [i for i in range(graph.n) if i != slow_rank]
    return sum(r.steps[i] for i in fast) / len(fast) / max(r.finish_time), r


@pytest.mark.parametrize("graph,slow_rank", [
    ("ring", 0), ("ring", 3), ("exp", 0), ("exp", 5), ("torus", 3), ("complete", 1)])
def test_default_options_keep_the_others_at_full_speed_next_to_a_4x_straggler(graph,
                                                                              slow_rank):
    """The issue: `--sync hop` ran every worker at the pace of a 4x slower one (old
    defaults: 0.25 of the speed without it)."""
    g = make_graph(graph, 8 if graph != "complete" else 4)
    alone, _ = fast_rate(g, HopOptions(), slow_rank, 1.0)
    with_straggler, r = fast_rate(g, HopOptions(), slow_rank, 4.0)
    assert with_straggler > 0.85 * alone
    assert r.skipped[slow_rank] > 0


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_a_jump_does_not_make_the_fast_neighbour_skip_too(factor):
    """Two workers, rank 0 slow. The old jump target (G - 1 past the slowest neighbour)
    left rank 0 ahead of rank 1, which then found itself behind every neighbour and jumped
    too, burning the tokens it needed to run: rank 1 at 0.83 (2x) and 0.51 (4x) of its
    speed, with ~220 iterations skipped. A jump level with the furthest neighbour never
    puts the slow worker ahead of everyone."""
    g = make_graph("ring", 2)
    alone, _ = fast_rate(g, HopOptions(), 0, 1.0)
    with_straggler, r = fast_rate(g, HopOptions(), 0, factor)
    assert r.skipped[1] == 0 and r.skipped[0] > 0
    assert with_straggler > 0.85 * alone
