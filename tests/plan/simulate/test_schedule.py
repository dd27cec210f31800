"""The event-driven schedule: pipeline bubble, DDP overlap, FIFO buckets, fluid sharing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.collective import Call
from dlcomm.plan.simulate.fluid import Sharing
from dlcomm.plan.simulate.schedule import (
    Segment,
    StagePlan,
    interleaved_order,
    simulate_schedule,
    stage_order,
)

from .conftest import RATE_BPS, dp_collectives, star


def _free(stage: int) -> Call:
    return Call("pp", stage, "p2p", "none", 0.0, ())


def _pipeline(p: int, tf: float, tb: float) -> list[StagePlan]:
    return [StagePlan([Segment(tf)], [Segment(tb)], _free(s) if s + 1 < p else None,
                      _free(s) if s else None) for s in range(p)]


@given(st.integers(1, 8), st.integers(1, 16), st.floats(0.1, 3.0), st.floats(0.1, 3.0),
       st.sampled_from(["1f1b", "gpipe"]))
@settings(max_examples=80, deadline=None)
def test_uniform_pipeline_takes_m_plus_p_minus_1_slots(p: int, m: int, tf: float, tb: float,
                                                       schedule: str) -> None:
    timeline = simulate_schedule(_pipeline(p, tf, tb), m, Sharing([], np.zeros(0)), schedule)
    total = (m + p - 1) * (tf + tb)
    assert timeline.iteration_s == pytest.approx(total, rel=1e-9)
    # the bubble: idle share (p-1)/(m+p-1) of every stage
    assert 1 - m * (tf + tb) / timeline.iteration_s == pytest.approx((p - 1) / (m + p - 1))


@given(st.integers(1, 8), st.integers(1, 12))
@settings(max_examples=60, deadline=None)
def test_1f1b_order(p: int, m: int) -> None:
    for s in range(p):
        ops = stage_order("1f1b", p, s, m)
        assert sorted(ops) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
        in_flight = 0
        for kind, j in ops:
            assert kind == "B" or ("F", j) in ops        # noqa: PT018
            in_flight += 1 if kind == "F" else -1
            assert 0 <= in_flight <= p - s               # activations held: at most p - s
        assert ops.index(("F", 0)) < ops.index(("B", 0))


def test_buckets_overlap_backward_first_in_first_out() -> None:
    """One stage: forward 1 s, backward in 3 parts of 1 s; bucket b ready after part b."""
    net = star(4)
    coll = dp_collectives(net, 4)
    sizes = [1.2e9, 0.3e9, 0.8e9]             # ring of 4: 1.5 x size / B each
    calls = [coll.gradients("dp", 0, n) for n in sizes]
    plan = StagePlan([Segment(1.0)], [Segment(1.0, None, (b,)) for b in range(3)], None, None,
                     calls)
    sharing = Sharing([net.patterns[c.steps[0].pattern] for c in calls[:1]], net.cap_Bps)
    timeline = simulate_schedule([plan], 1, sharing)
    t = [1.5 * n / RATE_BPS for n in sizes]   # 1.8, 0.45, 1.2 s
    end = 0.0
    for ready, dt in zip([2.0, 3.0, 4.0], t):
        end = max(end, ready) + dt              # FIFO: after the previous and when ready
    assert timeline.iteration_s == pytest.approx(max(4.0, end))
    st = timeline.stages[0]
    assert st.busy_comm_s["dp"] == pytest.approx(sum(t))
    assert st.compute_s == pytest.approx(4.0)


def test_transfers_share_the_network_as_they_overlap() -> None:
    """Two stages' all-reduces on the same links: fluid sharing while both run."""
    net = star(4)
    a = dp_collectives(net, 4).gradients("dp", 0, 2e9)        # alone: 1.5 x 2 GB / B = 3 s
    sharing = Sharing([net.patterns[a.steps[0].pattern]], net.cap_Bps)
    plans = [StagePlan([Segment(0.5)], [Segment(0.5, None, (0,))], _free(0), None, [a]),
             StagePlan([Segment(0.5)], [Segment(1.5, None, (0,))], None, _free(1), [a])]
    timeline = simulate_schedule(plans, 1, sharing)
    # stage 1: forward 0.5-1.0, backward 1.0-2.5, then its all-reduce; stage 0's backward
    # 2.5-3.0, then its all-reduce. Stage 1's runs alone for 0.5 s (1/6 done), then both
    # at half rate: stage 1 needs 2.5 s of full rate -> 5 s -> ends at 8.0; stage 0 did
    # 2.5 s of its 3 s by then, the last 0.5 s alone -> 8.5.
    assert timeline.stages[1].end_s == pytest.approx(8.0)
    assert timeline.iteration_s == pytest.approx(8.5)


def test_thousands_of_empty_segments_do_not_nest_the_stack() -> None:
    plan = StagePlan([Segment(0.0)] * 5000, [Segment(0.0)] * 5000 + [Segment(1.0)], None, None)
    assert simulate_schedule([plan], 2, Sharing([], np.zeros(0))).iteration_s == \
        pytest.approx(2.0)


@given(st.integers(2, 6), st.integers(1, 4), st.integers(2, 3), st.floats(0.1, 3.0),
       st.floats(0.1, 3.0))
@settings(max_examples=40, deadline=None)
def test_interleaved_bubble_is_a_vth(p: int, rounds: int, v: int, tf: float, tb: float) -> None:
    """v chunks of 1/v of the work each: the bubble shrinks to (p - 1)/v micro-batch slots
    (Narayanan et al., SC'21, Sec. 2.2.2)."""
    m = rounds * p
    plans = _pipeline(p * v, tf / v, tb / v)
    timeline = simulate_schedule(plans, m, Sharing([], np.zeros(0)), "interleaved", chunks=v)
    assert timeline.iteration_s == pytest.approx((m + (p - 1) / v) * (tf + tb), rel=1e-9)
    for d in range(p):
        ops = interleaved_order(p, d, m, v)
        assert sorted(ops) == sorted((k, j, c) for k in "FB" for j in range(m)
                                     for c in range(v))


def test_interleaved_needs_whole_rounds_and_chunks_need_it() -> None:
    with pytest.raises(ConfigError, match="multiple of the pipeline stages"):
        interleaved_order(4, 0, 6, 2)
    with pytest.raises(ConfigError, match="interleaved schedule"):
        simulate_schedule(_pipeline(4, 1, 1), 4, Sharing([], np.zeros(0)), "1f1b", chunks=2)


def test_deferred_buckets_wait_for_the_last_backward() -> None:
    """A virtual stage's buckets are queued in its own last backward; deferred (Megatron's
    own DDP), every chunk's wait for the device's last operation."""
    net = star(4)
    call = dp_collectives(net, 4).gradients("dp", 0, 0.8e9)   # 1.5 x 0.8 GB / B = 1.2 s
    sharing = Sharing([net.patterns[call.steps[0].pattern]], net.cap_Bps)
    plan = StagePlan([Segment(0.5)], [Segment(1.0, None, (0,))], None, None, [call])
    t = 1.5 * 0.8e9 / RATE_BPS
    overlapped = simulate_schedule([plan], 2, sharing)
    deferred = simulate_schedule([plan], 2, sharing, defer=True)
    # one chunk: its last backward is the device's last operation, so both agree
    assert deferred.iteration_s == pytest.approx(3.0 + t)
    assert overlapped.iteration_s == pytest.approx(2.0 + 1.0 + t)
    two = [StagePlan([Segment(0.5)], [Segment(1.0, None, (0,))], _free(0), None, [call]),
           StagePlan([Segment(0.5)], [Segment(1.0, None, (0,))], None, _free(0), [call])]
    # two chunks on one device: chunk 1's backward ends at 2.0, chunk 0's at 3.0
    over = simulate_schedule(two, 1, sharing, "interleaved", chunks=2)
    late = simulate_schedule(two, 1, sharing, "interleaved", chunks=2, defer=True)
    assert over.iteration_s == pytest.approx(2.0 + 2 * t)    # chunk 1's runs from 2.0
    assert late.iteration_s == pytest.approx(3.0 + 2 * t)    # both after the last backward
