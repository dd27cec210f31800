"""Fuzz the decoder and the dataplane: no input may crash the switch or corrupt a job.

A short run is part of the default suite; `make bench` (pytest -m slow) runs a long one.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import JobTable
from dlcomm.wire.packet import DATA, ERROR, HEADER_SIZE, Header, Malformed, decode, encode

W = [("10.0.0.1", 7000), ("10.0.0.2", 7000)]


def fresh():
    table = JobTable(8, 16)
    dp = Dataplane(table)
    job = table.register(W, 4, 16)
    dp.add_job(job)
    return dp, job


def mutations(job):
    valid = encode(Header(DATA, job.job_id, 0, 1, 4, 3, 8, 1, job.key),
                   np.arange(4, dtype=np.int32).tobytes())
    return st.one_of(
        st.binary(max_size=200),
        st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 255)).map(
            lambda p: valid[:p[0]] + bytes([p[1]]) + valid[p[0] + 1:]),
        st.integers(0, len(valid)).map(lambda cut: valid[:cut]),
        st.binary(min_size=1, max_size=64).map(lambda tail: valid + tail),
    )


def check_stream(datagrams):
    dp, job = fresh()
    for data, src in datagrams:
        try:
            decode(data)
        except Malformed:
            pass
        for addr, hdr, body in dp.on_datagram(data, src):
            assert len(hdr.pack()) == HEADER_SIZE and len(bytes(body)) < 2**16
            if addr not in W:  # only the rate-limited "unknown job" answer, never larger
                assert addr == src and hdr.type == ERROR
                assert HEADER_SIZE + len(bytes(body)) <= len(data)
    # the job still works afterwards: a clean round completes with the exact sum
    seq = 1000
    outs = []
    for w in range(2):
        outs = dp.on_datagram(encode(Header(DATA, job.job_id, w, 0, 2, seq, 0, 0, job.key),
                                     np.array([w + 1, 10], np.int32).tobytes()), W[w])
    assert np.frombuffer(bytes(outs[0][2]), np.int32).tolist() == [3, 20]
    assert dp.counters["packets_in"] == len(datagrams) + 2


def _strategy():
    _, job = fresh()
    return st.lists(st.tuples(mutations(job), st.sampled_from(W + [("10.0.0.9", 1)])),
                    max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_strategy())
def test_fuzz_short(datagrams):
    check_stream(datagrams)


@pytest.mark.slow
@settings(max_examples=20000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_strategy())
def test_fuzz_long(datagrams):
    check_stream(datagrams)
