"""The security findings about packets, each reproduced against a live switch on loopback.

Numbers refer to the findings of docs/security.md ("What was found, and what holds now").
Crashes are tried against a real ``dlcomm switch serve`` process (it must still run and serve
afterwards); the rest against a switch in a thread of the test, whose counters are read.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import time

import numpy as np
import pytest

from dlcomm.exchange.switch.window import AllreduceOp, Shard, Timing
from dlcomm.switch.service import running_switches
from dlcomm.wire.auth import JobKeys
from dlcomm.wire.channel import Channel
from dlcomm.wire.packet import (
    ANNOUNCE,
    DATA,
    ERROR,
    HEADER_SIZE,
    RESULT,
    SPARSE,
    SWITCH_RANK,
    Header,
    decode_header,
)
from dlcomm.wire.quant import value_limit
from dlcomm.wire.sparse import Blocks, data_width, pack_masks
from dlcomm.wire.sparse import encode as encode_sparse
from tests.switch.live import Line, drain, live_switch, own_job


def ints(values) -> bytes:
    return np.asarray(values, np.int32).tobytes()


def result_of(job, rank: int, wait: float = 2.0) -> tuple[Header, bytes]:
    """The next RESULT rank ``rank`` receives (verified with its keys)."""
    sock = job.socks[rank]
    sock.settimeout(wait)
    while True:
        data = sock.recv(1 << 16)
        hdr = decode_header(data)
        payload = job.channels[rank].open(hdr, memoryview(data))
        if hdr.type == RESULT:
            return hdr, bytes(payload)


BAD_ADDRESSES = [["127.0.0.1", 70000], ["127.0.0.1\x00", 5000], ["localhost", 5000],
                 ["224.0.0.1", 5000], ["239.1.2.3", 5000], ["0.0.0.0", 5000],
                 ["255.255.255.255", 5000], ["127.0.0.1", 0], ["127.0.0.1", True],
                 ["::1", 5000], ["127.0.0.1", 5000.5], "127.0.0.1:5000", ["a" * 1000, 1]]


def test_1_worker_addresses_cannot_crash_the_switch():
    """Ports beyond 65535, hosts with NUL, hostnames (DNS in the packet loop), multicast:
    each refused with one line, and the switch process lives on and serves."""
    with running_switches("127.0.0.1") as service:
        address, fp = service.addresses[0], service.fingerprints[0]
        with Line(address, fp) as line:
            for bad in BAD_ADDRESSES:
                reply = line.ask({"op": "register", "addresses": [bad, ["127.0.0.1", 5001]],
                                  "slots": 1, "k": 4})
                assert reply["ok"] is False and reply["error"], bad
        job = own_job(address, fp, workers=2, k=4)   # the old trigger: two mismatching DATA
        job.send(0, Header(DATA, job.job, 0, 0, 2, 0, 0, 0), ints([1, 2]), address)
        job.send(1, Header(DATA, job.job, 1, 0, 3, 0, 0, 0), ints([1, 2, 3]), address)
        time.sleep(0.3)
        assert service.procs[0].poll() is None
        job.close()
        own_job(address, fp).close()   # still serves


def test_1_a_send_that_raises_is_counted_and_the_loop_goes_on():
    """Fault injection: every send has its own exception boundary (not only OSError). The
    Python loop's (the native loop counts a failed send as send_errors: C has no other
    kind of failure to inject)."""
    with live_switch(dataplane="python") as live:
        job = own_job(live.address, live.fp, workers=1, k=4)
        dataplane = live.server.state.dataplane
        real = dataplane.on_datagram

        def poisoned(data, src, now=0.0):
            return [(("127.0.0.1", 70000), [b"x"]), (("127.0.0.1\x00", 1), [b"y"]),
                    *real(data, src, now)]

        dataplane.on_datagram = poisoned
        job.send(0, Header(DATA, job.job, 0, 0, 2, 0, 0, 0), ints([5, 6]), live.address)
        hdr, payload = result_of(job, 0)
        assert np.frombuffer(payload, np.int32).tolist() == [5, 6]
        assert live.counter("send_failures") == 2
        job.close()


def announce(job, rank, exps, seq=0, m=2):
    """A sparse announce round from ``rank`` with look-ahead exponents ``exps``."""
    head = np.zeros((len(exps), data_width(m)), np.int64)
    for i, e in enumerate(exps):
        head[i, :2] = (i, e)
        head[i, 2:] = pack_masks(np.ones((1, m), bool))[0]
    return Header(DATA, job.job, rank, 0, 0, seq, 0, 0, flags=SPARSE | ANNOUNCE), \
        encode_sparse(head, Blocks.empty())


def test_2_sparse_exponents_beyond_int16_cannot_crash_the_switch():
    """Look-ahead exponents of 100000 (their maximum once went into a 16-bit header field)
    are dropped before anything is added; a proper round then completes."""
    with running_switches("127.0.0.1") as service:
        address, fp = service.addresses[0], service.fingerprints[0]
        job = own_job(address, fp, workers=2, k=8, block=4)
        for rank in range(2):
            job.send(rank, *announce(job, rank, [100000, 2**31 - 1]), address)
        time.sleep(0.3)
        assert service.procs[0].poll() is None
        for rank in range(2):
            job.send(rank, *announce(job, rank, [3, 120]), address)
        hdr, _ = result_of(job, 0)
        assert hdr.exp == 120 and hdr.flags & SPARSE
        job.close()
    assert service.procs[0].returncode == 0
    assert service.final_stats[0]["counters"]["drop_bad_exponent"] == 2


def test_3_no_amplification_and_no_packets_to_addresses_that_did_not_ask():
    """A registration of 1,000 addresses makes the switch send nothing (nonces go only to
    a rank that asks from its own address); a mismatch gets one ERROR, no larger than the
    packet, to its sender alone, and later ones are rate-limited: at most 1x out."""
    with live_switch() as live:
        listeners = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
        with Line(live.address, live.fp) as line, contextlib.ExitStack() as stack:
            for sock in listeners:
                stack.enter_context(sock)
                sock.bind(("127.0.0.1", 0))
            many = [list(s.getsockname()) for s in listeners] + \
                [["127.0.0.1", 20000 + i] for i in range(997)]
            assert line.ask({"op": "register", "addresses": many, "slots": 1, "k": 4})["ok"]
            time.sleep(0.2)
            assert live.counter("packets_out") == 0
            assert live.counter("control_challenges_sent") == 0
            assert all(drain(sock, 0.05) == [] for sock in listeners)   # nothing arrived
        job = own_job(live.address, live.fp, workers=2, k=4)
        sent = [job.send(0, Header(DATA, job.job, 0, 0, 2, 0, 0, 0), ints([1, 2]), live.address)]
        out_before = live.counter("packets_out"), live.counter("bytes_out")
        for _ in range(5):
            sent.append(job.send(1, Header(DATA, job.job, 1, 0, 1, 0, 0, 0), ints([9]),
                                 live.address))
        got = drain(job.socks[1]) + drain(job.socks[0], 0.05)
        packets = live.counter("packets_out") - out_before[0]
        sent_bytes = live.counter("bytes_out") - out_before[1]
        assert packets == len(got) == 1 and decode_header(got[0]).type == ERROR
        assert sent_bytes <= len(sent[1]) and packets / 5 <= 1.0
        job.close()


def test_4_the_secret_never_travels_in_packets_and_groups_are_unguessable():
    with live_switch() as live:
        job = own_job(live.address, live.fp, workers=2, k=4)
        try:
            seen = [job.send(r, Header(DATA, job.job, r, 0, 2, 0, 0, 0), ints([1, 2]),
                             live.address) for r in range(2)]
            seen += drain(job.socks[0]) + drain(job.socks[1], 0.05)
            assert len(seen) == 4 and not any(s in d for s in job.secrets for d in seen)
            assert set(job.channels[0].keys.up) == {0}   # a worker holds its own keys only
            groups = set()
            with Line(live.address, live.fp) as line:
                for i in range(8):
                    reply = line.ask({"op": "register",
                                      "addresses": [["127.0.0.1", 4000 + i],
                                                    ["127.0.0.2", 4000 + i]],
                                      "slots": 1, "k": 4, "multicast_port": 4000 + i})
                    groups.add(reply["group"])
            # random over 239.0.0.0/8, not the old 239.77.<job> (one of eight may still
            # land in 239.77/16 by chance: 3% of runs; all of them, never)
            assert len(groups) == 8 and len({g.split(".")[1] for g in groups}) > 1, groups
        finally:
            job.close()


def test_4_nobody_attaches_as_another_rank():
    """From another IP, with another rank's ticket, without the nonce, or twice: refused."""
    with live_switch() as live:
        import socket
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        with Line(live.address, live.fp) as owner, \
                Line(live.address, live.fp, source="127.0.0.2") as stranger:
            reply = owner.ask({"op": "register", "slots": 1, "k": 4,
                               "addresses": [list(s.getsockname()) for s in socks]})
            job, tickets = reply["job"], reply["tickets"]
            ask = {"op": "challenge", "job": job, "rank": 0, "ticket": tickets[0]}
            assert "from 127.0.0.1 only" in stranger.ask(ask)["error"]
            assert owner.ask(ask)["ok"]
            nonce = drain(socks[0])[0][HEADER_SIZE:].hex()
            attach = {"op": "attach", "job": job, "rank": 0, "ticket": tickets[0],
                      "nonce": nonce}
            assert stranger.ask(attach)["ok"] is False
            assert owner.ask({**attach, "ticket": tickets[1]})["error"] == "no such job"
            assert owner.ask({**attach, "nonce": "00" * 16})["ok"] is False
            assert owner.ask(attach)["ok"]
            with Line(live.address, live.fp) as again:
                assert "attached already" in again.ask(attach)["error"]
        for s in socks:
            s.close()


def test_4_spoofed_results_jams_and_wrapping_values_change_nothing():
    with live_switch() as live:
        job = own_job(live.address, live.fp, workers=2, k=4)
        forged = Header(RESULT, job.job, SWITCH_RANK, 0, 2, 0, 0, 0).pack() + ints([6, 6]) \
            + bytes(16)
        with pytest.raises(ValueError):
            job.channels[0].open(decode_header(forged), memoryview(forged))   # workers refuse
        job.send(0, Header(DATA, job.job, 0, 0, 2, 0xFFFFFFFF, 0, 0), ints([1, 1]),
                 live.address)                                        # a jam: dropped
        limit = value_limit(2)
        job.send(0, Header(DATA, job.job, 0, 0, 2, 0, 0, 0), ints([limit + 1, 2**31 - 1]),
                 live.address)                                        # would wrap: dropped
        for rank in range(2):
            job.send(rank, Header(DATA, job.job, rank, 0, 2, 0, 0, 0), ints([limit, -3]),
                     live.address)
        hdr, payload = result_of(job, 1)
        assert hdr.seq == 0 and np.frombuffer(payload, np.int32).tolist() == [2 * limit, -6]
        assert live.counter("drop_out_of_order") == 1 and live.counter("drop_bad_value") == 1
        job.close()


def test_10_a_forged_error_cannot_end_a_workers_job():
    """An ERROR with the switch's source address, the job and slot, but no valid tag."""
    secret = bytes(range(32))
    channel = Channel(JobKeys.derive(secret, 7, 1, [0]), 0)
    x = np.ones(8, np.float32)
    switch = ("127.0.0.1", 9570)
    op = AllreduceOp(x, x.copy(), 0, 2, 4, [Shard(switch, 7, 1, channel)], [[0]], Timing())
    op.start(0.0)
    forged = Header(ERROR, 7, SWITCH_RANK, 0, 0, 0, 0, 0).pack(5) + b"job over" + bytes(16)
    assert op.on_datagram(forged, switch, 0.1) == []
    other_key = Channel(JobKeys.derive(bytes(32), 7, 1, range(1)), None)
    sealed = b"".join(other_key.seal(Header(ERROR, 7, SWITCH_RANK, 0, 0, 0, 0, 0), b"x", to=0))
    assert op.on_datagram(sealed, switch, 0.2) == []
    assert op.error is None and op.rejected == 2


def test_10_job_numbers_are_random():
    with live_switch() as live, Line(live.address, live.fp) as line:
        ids = [line.ask({"op": "register", "addresses": [["127.0.0.1", 5000 + i]], "slots": 1,
                         "k": 4})["job"] for i in range(12)]
    assert len(set(ids)) == 12 and sorted(ids) != list(range(ids[0], ids[0] + 12))
    steps = {(b - a) % 0xFFFE for a, b in zip(ids, ids[1:])}
    assert len(steps) > 1                      # no fixed stride either
    with live_switch() as other, Line(other.address, other.fp) as line:
        again = [line.ask({"op": "register", "addresses": [["127.0.0.1", 5000 + i]],
                           "slots": 1, "k": 4})["job"] for i in range(12)]
    assert again != ids                        # another switch draws other numbers


def test_13_unknown_jobs_and_forgeries_get_the_same_silence():
    with live_switch() as live:
        job = own_job(live.address, live.fp, workers=1, k=4)
        unknown = Header(DATA, (job.job % 0xFFFE) + 1, 0, 0, 1, 0, 0, 0).pack() + ints([1]) \
            + bytes(16)
        forged = Header(DATA, job.job, 0, 0, 1, 0, 0, 0).pack() + ints([1]) + bytes(16)
        for datagram in (unknown, forged):
            job.socks[0].sendto(datagram, live.address)
        assert drain(job.socks[0]) == []
        assert live.counter("drop_unknown_job") == 1 and live.counter("drop_bad_tag") == 1
        job.close()


def test_13_secrets_are_compared_in_constant_time(monkeypatch):
    """Tokens, tickets and nonces go through hmac.compare_digest."""
    import dlcomm.switch.control as control
    import dlcomm.switch.security as security
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append(len(a))
        return real(a, b)

    class Spy:
        compare_digest = staticmethod(spy)

    monkeypatch.setattr(security, "hmac", Spy)
    monkeypatch.setattr(control, "hmac", Spy)
    with live_switch(token="t" * 32) as live:
        own_job(live.address, live.fp, workers=1, k=4, token="t" * 32).close()
    # the pinned fingerprint (64 hex digits; the client's), the token (32, register), the
    # ticket (challenge and attach: 16 bytes each) and the nonce (16 bytes)
    assert sorted(calls) == [16, 16, 16, 32, 64], calls
