"""Workers and switches over an in-memory lossy network: results are exact, bit for bit."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcomm.exchange.switch.window import Timing
from dlcomm.switch.jobs import Address
from dlcomm.testing.fakenet import NetConfig, aggregate
from dlcomm.wire.packet import DATA, Header, encode
from dlcomm.wire.quant import chunk_exponents, error_bound


def inputs(n, length, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(length) * scale).astype(np.float32) for _ in range(n)]


def exact(xs):
    return np.sum([x.astype(np.float64) for x in xs], axis=0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 6), length=st.integers(0, 3000), k=st.sampled_from([1, 7, 64, 256]),
       window=st.integers(1, 6), shards=st.integers(1, 3), loss=st.sampled_from([0, 0.05, 0.2]),
       dup=st.sampled_from([0, 0.1]), jitter=st.sampled_from([0, 2e-3]), seed=st.integers(0, 99))
def test_lossy_network_gives_the_lossless_result(n, length, k, window, shards, loss, dup,
                                                 jitter, seed):
    xs = inputs(n, length, seed)
    clean = aggregate(xs, k, window, shards)
    lossy = aggregate(xs, k, window, shards, NetConfig(loss, dup, jitter, seed=seed))
    assert clean.errors == [None] * n and lossy.errors == [None] * n
    for a, b in zip(clean.outputs, lossy.outputs):
        assert a.tobytes() == b.tobytes()  # bit-identical under loss, duplication, reordering
    if length:
        err = np.abs(clean.outputs[0].astype(np.float64) - exact(xs))
        exps = np.max([chunk_exponents(x, k) for x in xs], axis=0)
        bound = np.repeat([error_bound(int(e), n) for e in exps], k)[:length]
        ulp = np.ldexp(1.0, np.frexp(np.abs(exact(xs)))[1] - 24)
        assert (err <= bound + ulp).all()


def test_consecutive_ops_continue_slot_sequences():
    xs = inputs(3, 5000, 1)
    res = aggregate(xs, 64, 3, ops_per_worker=4, net=NetConfig(loss=0.1, jitter_s=1e-3, seed=2))
    assert res.errors == [None] * 3
    assert all(o.tobytes() == res.outputs[0].tobytes() for o in res.outputs)


def test_nan_on_one_worker_fails_every_worker_clearly():
    xs = inputs(3, 1000, 2)
    xs[1][517] = np.nan
    res = aggregate(xs, 64, 4)
    assert all(e and "NaN or Inf" in e for e in res.errors)
    assert "rank 1" in res.errors[1] and "another worker" in res.errors[0]


def test_dead_worker_is_named_after_the_deadline():
    xs = inputs(3, 2000, 3)
    timing = Timing(deadline_s=2.0)

    def kill_rank_2(net, dataplanes):
        original = net.send

        def send(src, dst, data):
            if src != ("10.0.0.3", 7000):
                original(src, dst, data)
        net.send = send

    res = aggregate(xs, 64, 4, timing=timing, before=kill_rank_2, max_time_s=60)
    for err in res.errors[:2]:
        assert err and "still waiting for rank(s) 2" in err
    assert res.time_s < 10


def test_forged_packets_cannot_change_an_honest_job():
    """Anyone (another job's worker, a host that sniffed our packets) sends into our job's
    slots: forged tags, a stolen source address, replays of our own authentic packets. No
    effect on the sums, and every one is dropped for a reason."""
    xs = inputs(3, 4000, 4)
    clean = aggregate(xs, 64, 4)
    switch: Address = ("10.0.255.254", 9570)

    def forger(net, dataplanes):
        dp = dataplanes[0]
        job = next(iter(dp.table.jobs.values()))
        evil: Address = ("10.0.0.66", 7000)
        junk = np.full(64, 2**30, np.int32).tobytes()
        for seq in range(0, 200):
            for slot in range(4):
                for worker in range(3):
                    hdr = Header(DATA, job.job_id, worker, slot, 64, seq, 64 * slot, 30,
                                 counter=seq)
                    forged = encode(hdr, junk) + bytes(16)       # a tag that is not one
                    net.send(("10.0.0.1", 7000), switch, forged)  # from rank 0's address
                    net.send(evil, switch, forged)                # from elsewhere

        replayed = []

        def capture(packet):  # a sniffer on the wire: replay what rank 1 sends, later
            if packet.src == ("10.0.0.2", 7000) and packet.dst == switch:
                replayed.append(packet.data)
                if len(replayed) % 5 == 0:
                    net.send(packet.src, switch, replayed[len(replayed) // 2])
            return True
        net.observers.append(capture)

    res = aggregate(xs, 64, 4, before=forger)
    assert res.errors == [None] * 3
    assert all(o.tobytes() == c.tobytes() for o, c in zip(res.outputs, clean.outputs))
    drops = res.dataplanes[0].counters
    assert drops["drop_bad_tag"] > 0 and drops["drop_bad_source"] > 0
    assert drops["drop_replay"] > 0


@pytest.mark.parametrize("multicast", [True, False])
def test_multicast_and_unicast_agree(multicast):
    xs = inputs(4, 3000, 5)
    res = aggregate(xs, 128, 4, multicast=multicast)
    ref = aggregate(xs, 128, 4, multicast=not multicast)
    assert res.outputs[2].tobytes() == ref.outputs[2].tobytes()
    sent = res.net.bytes_sent[("10.0.255.254", 9570)]
    assert (sent < 0.5 * ref.net.bytes_sent[("10.0.255.254", 9570)]) == multicast
