"""The worker's retransmission timeout: what it measures and how it adapts."""

import numpy as np
import pytest

from dlcomm.exchange.switch.window import AllreduceOp, RttEstimator, Shard, Timing
from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import JobTable
from dlcomm.wire.packet import decode, encode

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
    assert op.rtt is not None and len(op.rtt.samples) == 12 + 2   # data and exponent rounds
    assert np.allclose(op.rtt.samples, 0.003)
    assert op.rtt.timeout() == pytest.approx(4 * 0.003)  # above the floor: 4x the smallest


def test_timeout_is_at_least_twice_the_median_round_trip():
    rtt = RttEstimator(Timing(min_timeout_s=0.001))
    assert rtt.timeout() == Timing().initial_timeout_s  # nothing measured yet
    for sample in [0.0005] * 5 + [0.020] * 11:       # few rounds are quick, most wait
        rtt.sample(sample)
    assert rtt.timeout() == 2 * 0.020
    assert rtt.timeout(backoff=2) == 4 * 2 * 0.020
    assert RttEstimator(Timing(max_timeout_s=0.05)).timeout(backoff=9) == 0.05
