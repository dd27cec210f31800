"""The native client against its specification, window.py's AllreduceOp: the same tensors,
the same lossy, duplicating, reordering network (the fake net, virtual time) and the same
datagrams in give byte-identical datagrams out, the same deadlines, the same sums (bit for
bit) and the same failures. Each rank runs both; the Python op's datagrams go on the wire,
the native twin's must equal them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcomm.exchange.switch.window import AllreduceOp, Shard, Timing
from dlcomm.testing.fakenet import FakeNet, NetConfig, _switches
from dlcomm.wire.auth import AUTH_ENCRYPT, AUTH_MAC, AUTH_NONE
from dlcomm.wire.sparse import present_blocks
from tests.native.twins import needs_native

pytestmark = needs_native


def key_material(shard: Shard, rank: int) -> bytes:
    m = shard.channel.keys.material
    return m[f"up {rank}"] + m[f"down {rank}"] + m["result"] if m else b""


class Twin:
    """One rank: the Python op and the native client, fed alike."""

    def __init__(self, rank, workers, k, shards, data, timing, count_block=0):
        from dlcomm.native.client import Client, ShardKeys

        self.rank, self.count_block = rank, count_block
        self.seqs = [[0] * s.slots for s in shards]
        self.py_out = data.copy()
        self.nat_out = data.copy()
        self.op = AllreduceOp(self.py_out, self.py_out, rank, workers, k, shards, self.seqs,
                              timing)
        self.client = Client(-1, rank, workers, k, shards[0].channel.mode,
                             [ShardKeys(s.address, s.job, s.slots, key_material(s, rank))
                              for s in shards],
                             timing.initial_timeout_s, timing.min_timeout_s,
                             timing.max_timeout_s, timing.deadline_s)

    def same(self, py_sends):
        py = [(addr, b"".join(bytes(p) for p in parts)) for addr, parts in py_sends]
        assert self.client.take() == py
        if not self.op.done:
            assert self.client.next_deadline() == self.op.next_deadline()
        assert (self.client.done() != 0) == self.op.done
        return py

    def start(self, now):
        sends = self.op.start(now)
        self.client.count_blocks(self.count_block)
        self.client.begin(self.nat_out, now)
        return self.same(sends)

    def datagram(self, data, src, now):
        sends = self.op.on_datagram(data, src, now)
        self.client.on_datagram(data, src, now)
        return self.same(sends)

    def timeout(self, now):
        sends = self.op.on_timeout(now)
        self.client.on_timeout(now)
        return self.same(sends)


def run_twins(inputs, k, window, shards, net, auth, timing=Timing(), silent=(), late=None,
              count_block=0):
    """``late``: rank -> when it starts (the others start at 0 and wait for it);
    ``count_block``: the native clients count their result's blocks of that size."""
    fnet = FakeNet(net)
    workers = [(f"10.0.0.{i + 1}", 7000) for i in range(len(inputs))]
    switch_addrs, dataplanes, views = _switches(fnet, workers, shards, window, k, False, 0, auth)
    twins = [Twin(r, len(inputs), k, views[r], inputs[r], timing, count_block)
             for r in range(len(inputs))]
    by_addr = {a: i for i, a in enumerate(workers)}
    by_switch = {a: s for s, a in enumerate(switch_addrs)}
    starts = {r: 0.0 for r in range(len(twins)) if r not in silent} | dict(late or {})
    live, started = sorted(starts), set()
    while any(not twins[r].op.done for r in live) and fnet.now < 600:
        waiting = [r for r in live if r not in started]
        if waiting and min(starts[r] for r in waiting) <= fnet.now:
            r = min(waiting, key=lambda r: starts[r])
            started.add(r)
            for dst, data in twins[r].start(fnet.now):
                fnet.send(workers[r], dst, data)
            continue
        deadline = min([twins[r].op.next_deadline() for r in started if not twins[r].op.done]
                       + [starts[r] for r in waiting])
        if deadline < fnet.next_time():
            fnet.now = max(fnet.now, deadline)
            for r in sorted(started):
                if not twins[r].op.done and twins[r].op.next_deadline() <= fnet.now:
                    for dst, data in twins[r].timeout(fnet.now):
                        fnet.send(workers[r], dst, data)
            continue
        ev = fnet.pop()
        if ev.dst in by_switch:
            for dst, parts in dataplanes[by_switch[ev.dst]].on_datagram(ev.data, ev.src,
                                                                         fnet.now):
                fnet.send(ev.dst, dst, b"".join(bytes(p) for p in parts))
        elif ev.dst in by_addr and by_addr[ev.dst] in started:
            r = by_addr[ev.dst]
            if not twins[r].op.done:
                for dst, data in twins[r].datagram(ev.data, ev.src, fnet.now):
                    fnet.send(workers[r], dst, data)
    return twins


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), workers=st.integers(1, 5), k=st.sampled_from([1, 5, 64]),
       window=st.integers(1, 6), shards=st.integers(1, 2),
       loss=st.sampled_from([0.0, 0.02, 0.2]), duplicate=st.sampled_from([0.0, 0.1]),
       auth=st.sampled_from([AUTH_NONE, AUTH_MAC, AUTH_ENCRYPT]),
       length=st.integers(0, 700), late=st.sampled_from([0.0, 0.05]))
def test_lossy_all_reduces_agree(seed, workers, k, window, shards, loss, duplicate, auth,
                                 length, late):
    """... with the last rank starting ``late`` (the others probe while they wait)."""
    rng = np.random.default_rng(seed)
    inputs = [(rng.standard_normal(length) * 10.0 ** rng.integers(-30, 30)).astype(np.float32)
              for _ in range(workers)]
    if length and rng.random() < 0.3:
        inputs[0][rng.integers(length)] = 0.0
    net = NetConfig(loss=loss, duplicate=duplicate, jitter_s=1e-4, seed=seed)
    block = {1: 1, 5: 5, 64: 16}[k]  # auto's count of the result's blocks (a divisor of k)
    twins = run_twins(inputs, k, window, shards, net, auth, late={workers - 1: late},
                      count_block=block)
    for twin in twins:
        assert twin.op.error is None
        assert twin.py_out.tobytes() == twin.nat_out.tobytes()
        # each chunk's blocks counted once, however often its result came, as the Python
        # reference finds them in the result
        assert twin.client.union_blocks() == int(present_blocks(twin.py_out, block)[0].sum())
        assert twin.client.stats()["retransmissions"] == twin.op.retransmissions
        assert twin.client.stats()["probes"] == twin.op.probes
        assert twin.client.stats()["rejected"] == twin.op.rejected


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_duplicated_results_are_counted_once(seed):
    """Without tags nothing drops a duplicate before the op's sequence check, so a result
    that comes twice reaches it: its blocks are counted once all the same."""
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(300).astype(np.float32) for _ in range(3)]
    for x in inputs:
        x[64:128] = 0.0                             # a block empty on every worker
    net = NetConfig(loss=0.05, duplicate=0.5, jitter_s=1e-4, seed=seed)
    twins = run_twins(inputs, 64, 3, 2, net, AUTH_NONE, count_block=16)
    for twin in twins:
        assert twin.py_out.tobytes() == twin.nat_out.tobytes()
        assert twin.client.union_blocks() == 19 - 4   # ceil(300 / 16) blocks, 4 empty


@pytest.mark.parametrize("auth", [AUTH_NONE, AUTH_MAC])
def test_a_silent_rank_fails_both_alike(auth):
    inputs = [np.ones(40, np.float32) for _ in range(3)]
    timing = Timing(deadline_s=2.0)
    twins = run_twins(inputs, 8, 2, 1, NetConfig(), auth, timing, silent=(2,))
    for twin in twins[:2]:
        err = twin.client.error(twin.op.last_progress + 2.5)
        assert err is not None and twin.op.error is not None
        assert err.missing == [2] and "rank(s) 2" in str(twin.op.error)


def test_a_block_that_does_not_divide_k_is_refused():
    from dlcomm.native.client import Client

    client = Client(-1, 0, 2, 64, AUTH_NONE, [], 0.01, 0.001, 1.0, 5.0)
    client.count_blocks(16)
    client.count_blocks(0)
    with pytest.raises(ValueError, match="must divide k"):
        client.count_blocks(24)


def test_non_finite_values_fail_both_alike():
    inputs = [np.ones(40, np.float32) for _ in range(2)]
    inputs[1][17] = np.nan
    twins = run_twins(inputs, 8, 2, 1, NetConfig(), AUTH_MAC)
    for twin in twins:
        err = twin.client.error(0.0)
        assert err is not None and "NaN" in str(twin.op.error)
        assert err.element == (16 if twin.rank == 1 else -1)


@pytest.mark.parametrize("auth", [AUTH_NONE, AUTH_MAC, AUTH_ENCRYPT])
def test_two_requests_to_send_again_read_together_give_two_intact_datagrams(auth):
    """The switch asks twice for a round it never got, and both answers are read before
    anything is sent (one batch of the socket loop): window.py sends the round twice, each
    sealed anew; the native client's queue held the packet's buffer, which the second seal
    rewrote under the first output (its counter and tag sent twice). Both must send the
    same two datagrams."""
    fnet = FakeNet(NetConfig())
    workers = [("10.0.0.1", 7000), ("10.0.0.2", 7000)]
    switch, dataplanes, views = _switches(fnet, workers, 1, 1, 16, False, 0, auth)
    twin = Twin(0, 2, 16, views[0], np.arange(40, dtype=np.float32), Timing())
    twin.start(0.0)                                   # the round is lost on the way
    statuses = []
    for _ in range(2):                                # two probes, two answers
        now = twin.op.next_deadline()
        for _, probe in twin.timeout(now):
            for _, parts in dataplanes[0].on_datagram(probe, workers[0], now):
                statuses.append(b"".join(bytes(p) for p in parts))
    assert len(statuses) == 2
    now += 1e-3
    py = [(addr, b"".join(bytes(p) for p in parts))
          for status in statuses for addr, parts in twin.op.on_datagram(status, switch[0], now)]
    for status in statuses:
        twin.client.on_datagram(status, switch[0], now)
    assert len(py) == 2 and py[0][1] != py[1][1]
    assert twin.client.take() == py
