"""The native switch as a service: `--dataplane`, `--threads`, a clear error when the native
code is missing, several packet threads summing one job's rounds exactly, the slow path
for jobs the Python dataplane serves (more than 64 workers; sparse jobs are native), and
counters merged from both."""

from __future__ import annotations

import time

import numpy as np

from dlcomm.native.switch import MAX_NATIVE_WORKERS
from dlcomm.switch.registrations import Limits
from dlcomm.testing.tenant import own_job
from dlcomm.wire.packet import ANNOUNCE, DATA, RESULT, SPARSE, Header, decode_header
from tests.conftest import run_dlcomm
from tests.native.twins import needs_native
from tests.switch.live import live_switch

pytestmark = needs_native


def rounds(job, address, count, workers, k=8):
    """``count`` rounds of every rank; the sums every rank received."""
    sums = []
    for seq in range(count):
        values = [np.arange(k, dtype=np.int32) * (r + 1) + seq for r in range(workers)]
        for rank in range(workers):
            job.send(rank, Header(DATA, job.job, rank, seq % 4, k, seq // 4, 0, 0),
                     values[rank].tobytes(), address)
        for rank in range(workers):
            job.socks[rank].settimeout(5)
            while True:
                data = job.socks[rank].recv(1 << 16)
                hdr = decode_header(data)
                if hdr.type == RESULT and hdr.slot == seq % 4:
                    payload = job.channels[rank].open(hdr, memoryview(data))
                    sums.append((np.frombuffer(payload, np.int32) == sum(values)).all())
                    break
    return sums


def test_two_packet_threads_sum_every_round_exactly():
    with live_switch(threads=2) as live:
        jobs = [own_job(live.address, live.fp, workers=3, k=8, slots=4) for _ in range(2)]
        try:
            for job in jobs:
                assert all(rounds(job, live.address, 12, 3))
        finally:
            for job in jobs:
                job.close()
        stats = live.server.stats()
        assert stats["dataplane"] == "native" and stats["native"]["threads"] == 2
        assert stats["counters"]["completions"] == 24
        assert len(live.server.sockets) == 2


def test_a_large_job_takes_the_slow_path_sparse_ones_do_not_and_counts_merge():
    # 65 control connections from one address: above the defaults' per-source limits
    with live_switch(limits=Limits(registrations_per_minute=1000,
                                   max_connections_per_source=1000)) as live:
        large = own_job(live.address, live.fp, workers=MAX_NATIVE_WORKERS + 1, k=8, slots=1)
        sparse = own_job(live.address, live.fp, workers=2, k=64, slots=2, block=32)
        dense = own_job(live.address, live.fp, workers=2, k=8, slots=4)
        try:
            assert all(rounds(dense, live.address, 4, 2))
            # a malformed DATA of the large job reaches the Python dataplane (counted there);
            # a malformed sparse one is dropped by the native one
            large.send(0, Header(DATA, large.job, 0, 0, 8, 0, 0, 0), b"\x01" * 10,
                       live.address)
            sparse.send(0, Header(DATA, sparse.job, 0, 0, 64, 0, 0, 0, flags=SPARSE | ANNOUNCE),
                        b"\x01" * 10, live.address)
            deadline = time.monotonic() + 5
            while live.counter("packets_in") < 10 and time.monotonic() < deadline:
                time.sleep(0.02)
            counters = live.server.stats()["counters"]
            assert counters["slow_path"] == 1 and counters["completions"] == 4
            assert counters["drop_length"] == 2   # one in each dataplane
            assert counters["packets_in"] >= 10   # native's and Python's, merged
        finally:
            for job in (large, sparse, dense):
                job.close()


def test_threads_need_the_native_dataplane_and_a_missing_library_says_so(tmp_path,
                                                                        monkeypatch):
    res = run_dlcomm("switch", "serve", "--bind", "127.0.0.1:0", "--dataplane", "python",
                     "--threads", "2", tmp=tmp_path)
    assert res.returncode != 0
    assert res.stderr.strip() == "dlcomm: error: --threads above 1 needs --dataplane native"
    monkeypatch.setenv("DLCOMM_NATIVE_LIB", str(tmp_path / "missing.so"))
    res = run_dlcomm("switch", "serve", "--bind", "127.0.0.1:0", tmp=tmp_path)
    assert res.returncode != 0
    line = res.stderr.strip()
    assert line.startswith("dlcomm: error: cannot load dlcomm's native data path") and \
        "\n" not in line, line
