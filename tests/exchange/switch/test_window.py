"""The worker's retransmission timeout: what it measures and how it adapts."""

import os

import numpy as np
import pytest

from dlcomm.exchange.switch.window import AllreduceOp, RttEstimator, Shard, Timing
from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import JobTable
from dlcomm.wire.auth import AUTH_MAC, JobKeys
from dlcomm.wire.channel import Channel
from dlcomm.wire.packet import COMPLETE, RESEND, RESULT, STATUS, SWITCH_RANK, Header

WORKER, SWITCH = ("10.0.0.1", 7000), ("10.0.255.254", 9570)


def joined(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


def run_alone(delay_s: float, chunks: int = 12) -> AllreduceOp:
    """One worker's op against a real dataplane; every result arrives ``delay_s`` after
    the round it answers was sent."""
    table = JobTable(8, 1024)
    dp = Dataplane(table)
    job = table.register([WORKER], slots=2, k=4)
    job.live = True
    dp.add_job(job)
    x = np.arange(4 * chunks, dtype=np.float32)
    channel = Channel(JobKeys.derive(job.secret, job.job_id, job.auth, [0]), 0)
    op = AllreduceOp(x, x.copy(), 0, 1, 4, [Shard(SWITCH, job.job_id, 2, channel)], [[0, 0]],
                     Timing())
    now = 0.0
    pending = op.start(now)
    while pending:
        now += delay_s
        answers = []
        for _, parts in pending:
            for _, reply in dp.on_datagram(joined(parts), WORKER, now):
                answers += op.on_datagram(joined(reply), SWITCH, now)
        pending = answers
    assert op.done and op.error is None
    return op


def test_round_trips_are_measured_from_a_send_to_its_result():
    op = run_alone(0.003)
    assert len(op.timer.samples) == 12 + 2   # data and exponent rounds
    assert np.allclose(op.timer.samples, 0.003)
    assert op.timer.timeout() == pytest.approx(4 * 0.003)  # above the floor: 4x the smallest


def test_timeout_is_at_least_twice_the_median_round_trip():
    rtt = RttEstimator(Timing(min_timeout_s=0.001))
    assert rtt.timeout() == Timing().initial_timeout_s  # nothing measured yet
    for sample in [0.0005] * 5 + [0.020] * 11:       # few rounds are quick, most wait
        rtt.sample(sample)
    assert rtt.timeout() == 2 * 0.020
    assert rtt.timeout(backoff=2) == 4 * 2 * 0.020
    assert RttEstimator(Timing(max_timeout_s=0.05)).timeout(backoff=9) == 0.05


class Switch:
    """The switch's end of a two-worker job's channel (no dataplane: the test speaks)."""

    def __init__(self) -> None:
        secret = os.urandom(32)
        self.channel = Channel(JobKeys.derive(secret, 1, AUTH_MAC, range(2)), None)
        self.worker = Channel(JobKeys.derive(secret, 1, AUTH_MAC, [0]), 0)

    def send(self, op, hdr, body=b"", now=0.0):
        return op.on_datagram(joined(self.channel.seal(hdr, body, to=0)), SWITCH, now)

    def status(self, op, pos, missing, complete=False, seq=None, now=0.0):
        """A STATUS from the switch about ``pos``'s round."""
        hdr = Header(STATUS, op.shards[0].job, SWITCH_RANK, pos.slot, 0,
                     pos.seq if seq is None else seq, 0, 0,
                     flags=COMPLETE if complete else 0)
        return self.send(op, hdr, missing.to_bytes(1, "little"), now)


def sent_header(send):
    from dlcomm.wire.packet import decode_header
    return decode_header(joined(send[1]))


def test_waiting_for_a_straggler_backs_off_and_still_measures_the_round():
    """A worker whose part is in probes less often while others are missing (at most 4x
    the base timeout); a late older STATUS does not forget that the round was complete;
    probed rounds give no round-trip sample, unprobed ones do."""
    x = np.ones(4, np.float32)
    switch = Switch()
    op = AllreduceOp(x, x.copy(), 0, 2, 4, [Shard(SWITCH, 1, 1, switch.worker)], [[0]],
                     Timing())
    first = sent_header(op.start(0.0)[0])
    pos = op.positions[0]
    base = op.timer.timeout()
    waits = []
    for t in (0.2, 0.6, 1.4, 3.0):
        assert switch.status(op, pos, missing=0b10, now=t) == []  # rank 1 is missing
        waits.append(round(pos.deadline - t, 9))
    assert waits == [2 * base, 4 * base, 4 * base, 4 * base]
    switch.status(op, pos, missing=0, complete=True, now=3.1)
    switch.status(op, pos, missing=0b10, now=3.2)        # reordered: sent before the above
    assert pos.complete_seen
    probe = sent_header(op.on_timeout(pos.deadline)[0])   # asks the switch to send it again
    assert probe.flags & RESEND
    switch.send(op, Header(RESULT, 1, SWITCH_RANK, pos.slot, 0, pos.seq, first.tsi, 3),
                now=3.3)
    assert list(op.timer.samples) == []     # probed: no sample
    sent_at = pos.sent_at                 # the next round, answered without a probe
    switch.send(op, Header(RESULT, 1, SWITCH_RANK, pos.slot, 4, pos.seq, pos.header.tsi, 3),
                np.zeros(4, np.int32).tobytes(), now=sent_at + 0.004)
    assert list(op.timer.samples) == [pytest.approx(0.004)]


def test_a_stray_sparse_round_leaves_the_completed_round_alone():
    """A sparse DATA for a round the slot never planned is dropped without touching the
    copy, so a later RESEND of the stored result still gets it."""
    from dlcomm.wire.packet import ANNOUNCE, DATA, SPARSE
    from dlcomm.wire.sparse import Blocks
    from dlcomm.wire.sparse import encode as encode_sparse
    from tests.switch.crew import Crew
    table = JobTable(8, 1024)
    dp = Dataplane(table)
    job = table.register([WORKER], slots=1, k=8, block=4)
    job.live = True
    dp.add_job(job)
    crew = Crew(job)
    empty = encode_sparse(np.zeros((0, 3), np.int64), Blocks.empty())
    announce = Header(DATA, job.job_id, 0, 0, 0, 0, 8, 0, flags=SPARSE | ANNOUNCE)
    (_, done, body), = crew.read(dp.on_datagram(crew.packet(announce, empty), WORKER))
    stray = Header(DATA, job.job_id, 0, 0, 0, 2, 99, 0, flags=SPARSE)
    assert dp.on_datagram(crew.packet(stray, empty), WORKER) == []
    assert dp.counters["drop_out_of_order"] == 1
    again = crew.read(dp.on_datagram(crew.packet(announce, empty), WORKER))  # resent
    assert [(h.seq, h.numel, h.tsi, bytes(b)) for _, h, b in again] == \
        [(0, done.numel, done.tsi, bytes(body))]


def test_while_only_others_are_missing_one_position_per_shard_probes():
    """A late worker draws one probe per timeout from each early worker's shard, not one
    from every position; a STATUS lacking this worker, or a result, ends the hold."""
    x = np.ones(12, np.float32)
    switch = Switch()
    op = AllreduceOp(x, x.copy(), 0, 2, 4, [Shard(SWITCH, 1, 3, switch.worker)], [[0, 0, 0]],
                     Timing())
    assert len(op.start(0.0)) == 3
    p0, p1, p2 = op.positions
    switch.status(op, p0, missing=0b10, now=0.01)          # rank 1 has sent nothing yet
    now = max(p1.deadline, p2.deadline)
    probes = op.on_timeout(now)
    assert [sent_header(s).slot for s in probes] == [p1.slot]   # p0 waits, p2 holds
    assert p2.deadline == pytest.approx(now + op.holding[0]) and p2.retries == 0
    assert op.probes == 1
    # p1's own packet was lost: the switch lacks this worker there, so every position
    # probes again on its own timeout
    assert len(switch.status(op, p1, missing=0b11, now=now + 0.001)) == 1
    assert op.holding == [None]
    later = max(p.deadline for p in op.positions)
    assert len(op.on_timeout(later)) == 3
