"""The native client's sparse rounds against their specification, sparse_window.py's
SparseAllreduceOp: every rank runs both on the same tensor (every sparsity pattern, signed
zeros, a partial last block), through the Python switch over a lossy, duplicating,
reordering fake net; the Python op's datagrams go on the wire and the native twin's must
equal them byte for byte, with the same deadlines, the same sums and the same counts of
blocks that came back."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcomm.exchange.switch.sparse_window import SparseAllreduceOp
from dlcomm.exchange.switch.window import Timing
from dlcomm.testing.fakenet import FakeNet, NetConfig, _switches
from dlcomm.wire.auth import AUTH_ENCRYPT, AUTH_MAC, AUTH_NONE
from dlcomm.wire.sparse import presence
from tests.native.test_client_differential import key_material
from tests.native.twins import needs_native
from tests.switch.test_sparse import sparse_inputs

pytestmark = needs_native


class SparseTwin:
    def __init__(self, rank, workers, k, block, shards, data, timing, given_presence):
        from dlcomm.native.client import Client, ShardKeys

        self.py_out, self.nat_out = data.copy(), data.copy()
        seqs = [[0] * s.slots for s in shards]
        known = presence(data, block) if given_presence else None
        self.op = SparseAllreduceOp(self.py_out, self.py_out, rank, workers, k, shards, seqs,
                                    timing, block=block, presence=known)
        self.client = Client(-1, rank, workers, k, shards[0].channel.mode,
                             [ShardKeys(s.address, s.job, s.slots, key_material(s, rank))
                              for s in shards],
                             timing.initial_timeout_s, timing.min_timeout_s,
                             timing.max_timeout_s, timing.deadline_s)
        self.block, self.known = block, known

    def same(self, py_sends):
        py = [(addr, b"".join(bytes(p) for p in parts)) for addr, parts in py_sends]
        assert self.client.take() == py
        if not self.op.done:
            assert self.client.next_deadline() == self.op.next_deadline()
        assert (self.client.done() != 0) == self.op.done
        return py

    def start(self, now):
        sends = self.op.start(now)
        k = self.known
        self.client.begin_sparse(self.nat_out, self.block, now,
                                 k.present if k else None, k.negative_zero if k else None)
        return self.same(sends)

    def datagram(self, data, src, now):
        sends = self.op.on_datagram(data, src, now)
        self.client.on_datagram(data, src, now)
        return self.same(sends)

    def timeout(self, now):
        sends = self.op.on_timeout(now)
        self.client.on_timeout(now)
        return self.same(sends)


def run_sparse_twins(inputs, k, block, window, shards, net, auth, given_presence=False):
    fnet = FakeNet(net)
    workers = [(f"10.0.0.{i + 1}", 7000) for i in range(len(inputs))]
    switch_addrs, dataplanes, views = _switches(fnet, workers, shards, window, k, False, block,
                                                auth)
    twins = [SparseTwin(r, len(inputs), k, block, views[r], inputs[r], Timing(),
                        given_presence) for r in range(len(inputs))]
    by_addr = {a: i for i, a in enumerate(workers)}
    by_switch = {a: s for s, a in enumerate(switch_addrs)}
    for r, twin in enumerate(twins):
        for dst, data in twin.start(0.0):
            fnet.send(workers[r], dst, data)
    while any(not t.op.done for t in twins) and fnet.now < 600:
        deadline = min(t.op.next_deadline() for t in twins if not t.op.done)
        if deadline < fnet.next_time():
            fnet.now = max(fnet.now, deadline)
            for r, t in enumerate(twins):
                if not t.op.done and t.op.next_deadline() <= fnet.now:
                    for dst, data in t.timeout(fnet.now):
                        fnet.send(workers[r], dst, data)
            continue
        ev = fnet.pop()
        if ev.dst in by_switch:
            for dst, parts in dataplanes[by_switch[ev.dst]].on_datagram(ev.data, ev.src,
                                                                         fnet.now):
                fnet.send(ev.dst, dst, b"".join(bytes(p) for p in parts))
        elif ev.dst in by_addr and not twins[by_addr[ev.dst]].op.done:
            r = by_addr[ev.dst]
            for dst, data in twins[r].datagram(ev.data, ev.src, fnet.now):
                fnet.send(workers[r], dst, data)
    return twins


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 4), length=st.integers(0, 3000), b=st.sampled_from([4, 32]),
       m=st.integers(1, 40), window=st.integers(1, 4), shards=st.integers(1, 2),
       pattern=st.sampled_from(["shared", "independent", "disjoint", "zeros", "one"]),
       density=st.sampled_from([0.01, 0.1, 0.5, 1.0]), loss=st.sampled_from([0, 0.1]),
       auth=st.sampled_from([AUTH_NONE, AUTH_MAC, AUTH_ENCRYPT]), given_presence=st.booleans(),
       seed=st.integers(0, 99))
def test_sparse_rounds_agree_datagram_for_datagram(n, length, b, m, window, shards, pattern,
                                                   density, loss, auth, given_presence, seed):
    xs = sparse_inputs(n, length, b, pattern, density, seed)
    rng = np.random.default_rng(seed)
    for x in xs:   # signed zeros in absent blocks: cleared to +0.0 by both
        zero = np.flatnonzero(x == 0)
        x[zero[rng.random(len(zero)) < 0.05]] = -0.0
    net = NetConfig(loss=loss, duplicate=loss / 2, jitter_s=1e-3, seed=seed)
    twins = run_sparse_twins(xs, m * b, b, window, shards, net, auth, given_presence)
    for t in twins:
        assert t.op.error is None
        assert t.py_out.tobytes() == t.nat_out.tobytes()
        assert t.client.union_blocks() == t.op.union_blocks
        assert t.client.stats()["retransmissions"] == t.op.retransmissions
        assert t.client.stats()["probes"] == t.op.probes


def test_long_look_aheads_and_dense_runs_agree():
    """More groups than one look-ahead per position, and dense runs between sparse rounds."""
    xs = sparse_inputs(3, 120_000, 32, "independent", 0.3, 5)
    ys = sparse_inputs(3, 120_000, 32, "shared", 1.0, 6)
    for inputs in (xs, ys, [x + y for x, y in zip(xs, ys)]):
        twins = run_sparse_twins(inputs, 32 * 33, 32, 3, 1, NetConfig(loss=0.02, seed=3),
                                 AUTH_MAC)
        for t in twins:
            assert t.op.error is None and t.py_out.tobytes() == t.nat_out.tobytes()


def test_non_finite_values_fail_both_alike():
    xs = sparse_inputs(2, 1000, 8, "shared", 0.5, 1)
    xs[1][np.flatnonzero(xs[1])[3]] = np.inf
    twins = run_sparse_twins(xs, 64, 8, 2, 1, NetConfig(), AUTH_MAC)
    for rank, t in enumerate(twins):
        err = t.client.error(0.0)
        assert err is not None and "NaN or Inf" in str(t.op.error)
        assert (err.element >= 0) == (rank == 1)
