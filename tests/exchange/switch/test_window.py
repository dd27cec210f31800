"""The worker's retransmission timeout: what it measures and how it adapts."""

import numpy as np
import pytest

from dlcomm.exchange.switch.window import AllreduceOp, RttEstimator, Shard, Timing
from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import JobTable
from dlcomm.wire.packet import COMPLETE, RESEND, RESULT, STATUS, SWITCH_RANK, Header, decode, encode

WORKER, SWITCH = ("10.0.0.1", 7000), ("10.0.255.254", 9570)


def run_alone(delay_s: float, chunks: int = 12) -> AllreduceOp:
    """One worker's op against a real dataplane; every result arrives ``delay_s`` after
    the round it answers was sent."""
    table = JobTable(8, 1024)
    dp = Dataplane(table)
    job = table.register([WORKER], slots=2, k=4)
    dp.add_job(job)
    x = np.arange(4 * chunks, dtype=np.float32)
    op = AllreduceOp(x, x.copy(), 0, 1, 4, [Shard(SWITCH, job.job_id, job.key, 2)], [[0, 0]],
                     Timing())
    now = 0.0
    pending = op.start(now)
    while pending:
        now += delay_s
        answers = []
        for _, hdr, body in pending:
            for _, rhdr, rbody in dp.on_datagram(encode(hdr, bytes(body)), WORKER, now):
                got, payload = decode(encode(rhdr, bytes(rbody)))
                answers += op.on_packet(got, payload, SWITCH, now)
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


def status(op, pos, missing, complete=False, seq=None):
    """A STATUS from the switch about ``pos``'s round."""
    hdr = Header(STATUS, op.shards[0].job, SWITCH_RANK, pos.slot, 0,
                 pos.seq if seq is None else seq, 0, 0, op.shards[0].key,
                 COMPLETE if complete else 0)
    return decode(encode(hdr, missing.to_bytes(1, "little")))


def test_waiting_for_a_straggler_backs_off_and_still_measures_the_round():
    """A worker whose part is in probes less often while others are missing (at most 4x
    the base timeout); a late older STATUS does not forget that the round was complete;
    probed rounds give no round-trip sample, unprobed ones do."""
    x = np.ones(4, np.float32)
    op = AllreduceOp(x, x.copy(), 0, 2, 4, [Shard(SWITCH, 1, 7, 1)], [[0]], Timing())
    (_, first, _), = op.start(0.0)
    pos = op.positions[0]
    base = op.timer.timeout()
    waits = []
    for t in (0.2, 0.6, 1.4, 3.0):
        hdr, body = status(op, pos, missing=0b10)   # rank 1 is missing, we are in
        assert op.on_packet(hdr, body, SWITCH, t) == []
        waits.append(round(pos.deadline - t, 9))
    assert waits == [2 * base, 4 * base, 4 * base, 4 * base]
    hdr, body = status(op, pos, missing=0, complete=True)
    op.on_packet(hdr, body, SWITCH, 3.1)
    hdr, body = status(op, pos, missing=0b10)           # reordered: sent before the above
    op.on_packet(hdr, body, SWITCH, 3.2)
    assert pos.complete_seen
    (_, probe, _), = op.on_timeout(pos.deadline)     # asks the switch to send it again
    assert probe.flags & RESEND
    result = Header(RESULT, 1, SWITCH_RANK, pos.slot, 0, pos.seq, first.tsi, 3, 7)
    hdr, body = decode(encode(result))
    op.on_packet(hdr, body, SWITCH, 3.3)
    assert list(op.timer.samples) == []     # probed: no sample
    sent_at = pos.sent_at                 # the next round, answered without a probe
    hdr, body = decode(encode(Header(RESULT, 1, SWITCH_RANK, pos.slot, 4, pos.seq,
                                     pos.header.tsi, 3, 7), np.zeros(4, np.int32).tobytes()))
    op.on_packet(hdr, body, SWITCH, sent_at + 0.004)
    assert list(op.timer.samples) == [pytest.approx(0.004)]


def test_a_stray_sparse_round_leaves_the_completed_round_alone():
    """A sparse DATA for a round the slot never planned is dropped without touching the
    copy, so a later RESEND of the stored result still gets it."""
    from dlcomm.wire.packet import ANNOUNCE, DATA, SPARSE
    from dlcomm.wire.sparse import Blocks
    from dlcomm.wire.sparse import encode as encode_sparse
    table = JobTable(8, 1024)
    dp = Dataplane(table)
    job = table.register([WORKER], slots=1, k=8, block=4)
    dp.add_job(job)
    empty = encode_sparse(np.zeros((0, 3), np.int64), Blocks.empty())
    announce = Header(DATA, job.job_id, 0, 0, 0, 0, 8, 0, job.key, SPARSE | ANNOUNCE)
    (_, done, body), = dp.on_datagram(encode(announce, empty), WORKER)
    stray = Header(DATA, job.job_id, 0, 0, 0, 2, 99, 0, job.key, SPARSE)
    assert dp.on_datagram(encode(stray, empty), WORKER) == []
    assert dp.counters["drop_out_of_order"] == 1
    again = dp.on_datagram(encode(announce, empty), WORKER)   # a retransmission
    assert [(h.seq, h.numel, h.tsi, bytes(b)) for _, h, b in again] == \
        [(0, done.numel, done.tsi, bytes(body))]
