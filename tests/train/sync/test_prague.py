"""Prague's group generators: random groups with group buffers, the static conflict-free
schedule, the ready-worker buffer with group division; ending; and, in the discrete-event
simulation with random delays, no deadlock, no worker in two groups, creation order."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.errors import ConfigError
from dlcomm.train.sync.prague import (
    GENERATORS,
    GroupBuffer,
    RandomGroups,
    StaticSchedule,
    make_generator,
    static_partition,
)
from dlcomm.train.sync.sim import simulate_prague


@given(st.integers(2, 40), st.integers(2, 8), st.integers(0, 50))
def test_static_rounds_are_partitions(n, g, r):
    groups = static_partition(n, g, r)
    members = [m for group in groups for m in group]
    assert sorted(members) == list(range(n))          # everyone exactly once: no conflict
    assert all(2 <= len(group) <= min(g, n) + 1 for group in groups)


def test_static_butterfly_mixes_everyone_in_log_rounds():
    for n, g in [(8, 2), (16, 4), (27, 3)]:
        reach = {i: {i} for i in range(n)}
        rounds = round(__import__("math").log(n, g))
        for r in range(rounds):
            for group in static_partition(n, g, r):
                union = set().union(*(reach[m] for m in group))
                for m in group:
                    reach[m] = union
        assert all(len(v) == n for v in reach.values())
    assert static_partition(8, 4, 0) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert static_partition(8, 4, 1) == [(0, 1, 6, 7), (2, 3, 4, 5)]   # rotated by 2


def test_random_groups_queue_in_the_group_buffer():
    gen = RandomGroups(8, 4, seed=1)
    (d,) = gen.ready(0, 0.0)
    assert d.rank == 0 and 0 in d.group.members and len(d.group.members) == 4
    others = [m for m in d.group.members if m != 0]
    (d2,) = gen.ready(others[0], 0.1)
    assert d2.group == d.group                # named before it asked: gets that group first
    gen.ready(others[1], 0.2)
    gen.ready(others[2], 0.3)
    assert gen.max_step_gap == 0 and gen.stats()["groups"] == 1


def test_ending_drains_the_groups_others_wait_in():
    gen = RandomGroups(4, 2, seed=0)
    (d,) = gen.ready(0, 0.0, steps=5)
    partner = d.group.members[1]
    (stop,) = gen.ready(0, 0.1, steps=9, final=True)
    assert stop.group is None and gen.stopped
    (late,) = gen.ready(partner, 0.2, steps=3)
    assert late.group == d.group              # still runs the group rank 0 waits in
    assert gen.ready(partner, 0.3)[0].group is None
    assert gen.max_step_gap == 2


def test_static_schedule_after_the_end():
    gen = StaticSchedule(4, 2)
    gen.ready(0, 0.0)                         # round 0 opened by rank 0
    gen.ready(0, 0.1)                         # round 1 opened by rank 0
    gen.ready(2, 0.2, final=True)             # the end: rank 2 gets its opened groups
    got = []
    while (d := gen.ready(1, 0.3)[0]).group is not None:
        got.append(d.group.round)
    partners = {m for r in (0, 1) for grp in static_partition(4, 2, r) if 0 in grp for m in grp}
    assert got == [r for r in (0, 1) if any(1 in grp and 0 in grp
                                           for grp in static_partition(4, 2, r))]
    assert partners


def test_buffer_groups_only_ready_workers_and_divides_after_the_window():
    gen = GroupBuffer(8, 4, seed=0, window_s=0.01)
    assert gen.ready(0, 0.000) == [] and gen.ready(1, 0.001) == []
    assert gen.next_deadline() == pytest.approx(0.01)
    assert gen.tick(0.005) == []
    out = gen.tick(0.011)                     # window over: divide the two that are ready
    assert sorted(d.rank for d in out) == [0, 1] and gen.divisions == 1
    for r in (2, 3, 4):
        assert gen.ready(r, 0.02) == []
    out = gen.ready(5, 0.02)                  # four ready: a group at once
    assert sorted(d.rank for d in out) == [2, 3, 4, 5]


def test_buffer_prefers_new_partners():
    gen = GroupBuffer(8, 2, seed=3, window_s=1.0)
    gen.ready(0, 0.0)
    gen.ready(1, 0.0)                         # {0, 1}
    gen.ready(0, 0.1)
    assert gen.ready(1, 0.1) == []            # the same pair while others exist: wait
    out = gen.ready(2, 0.1)
    assert sorted(d.rank for d in out) == [0, 2]


def test_buffer_adaptive_window_follows_the_majority():
    gen = GroupBuffer(4, 2, seed=0)
    assert gen.window_s == GroupBuffer.INITIAL_WINDOW_S
    simulate_prague(gen, 50, lambda rank, rng: 0.12 if rank == 3 else 0.03, preduce_s=0.002,
                    rpc_s=lambda rng: 0.0005)
    away = 0.03 + 0.002 + 2 * 0.0005             # a fast worker's step, P-Reduce, round trip
    assert gen.window_s == pytest.approx(away / 3, rel=0.05)


def test_generator_errors():
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        make_generator("random", 8, 1)
    with pytest.raises(ConfigError, match=">= 2 workers"):
        make_generator("static", 1, 2)
    with pytest.raises(ConfigError, match="unknown prague generator"):
        make_generator("smart", 8, 2)
    assert GENERATORS.names() == ["buffer", "random", "static"]


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(["random", "static", "buffer"]), st.integers(2, 10), st.integers(2, 5),
       st.lists(st.sampled_from([1.0, 1.0, 3.0, 8.0]), min_size=10, max_size=10),
       st.floats(0.0, 0.3), st.integers(0, 2**16))
def test_no_deadlock_no_double_booking_in_order(name, n, g, slow, transient, seed):
    gen = make_generator(name, n, g, seed=seed)

    def compute(rank, rng):
        burst = 4.0 if rng.random() < transient else 1.0
        return 0.01 * slow[rank] * burst * rng.uniform(0.5, 1.5)

    r = simulate_prague(gen, 15, compute, seed=seed)
    assert not r.deadlock
    assert r.double_booked == 0
    if name != "static":                      # static runs groups in round order instead
        assert r.out_of_order == 0
    assert max(r.steps) >= 15


def test_buffer_generator_is_heterogeneity_tolerant_and_static_is_not():
    def compute(rank, rng):
        return (0.12 if rank == 3 else 0.03) * rng.uniform(0.9, 1.1)

    times = {}
    for name in ("static", "buffer"):
        r = simulate_prague(make_generator(name, 8, 4), 100, compute, seed=1)
        times[name] = max(r.finish_time)
        assert not r.deadlock
    assert times["buffer"] < 0.5 * times["static"]
    assert list(itertools.islice(GENERATORS, 3)) == ["buffer", "random", "static"]
