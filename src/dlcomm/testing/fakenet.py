"""An in-memory network for the pure state machines: tests, fuzzing and simulation.

Workers (:class:`~dlcomm.exchange.switch.window.AllreduceOp`) and switches
(:class:`~dlcomm.switch.dataplane.Dataplane`) exchange real encoded datagrams through a
discrete-event network with virtual time. Each node's egress link serialises its packets at
``rate_bps`` (None: infinitely fast) and adds ``latency_s``; a packet can be lost,
duplicated, or delayed by random jitter (which reorders packets). A multicast group is
replicated to its members as a bridge would. Nothing here touches a socket, so thousands of
lossy all-reduces run in a test, and the simulator can check protocol behaviour at packet
level.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dlcomm.exchange.switch.sparse_window import SparseAllreduceOp
from dlcomm.exchange.switch.window import AllreduceOp, Shard, Timing
from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import Address, JobTable
from dlcomm.wire.auth import AUTH_MAC, JobKeys
from dlcomm.wire.channel import Channel, Parts
from dlcomm.wire.packet import max_elements

__all__ = ["NetConfig", "FakeNet", "Sniffed", "aggregate", "AggregateResult"]


@dataclass(frozen=True)
class NetConfig:
    loss: float = 0.0            # probability that a datagram is lost
    duplicate: float = 0.0       # probability that a datagram arrives twice
    jitter_s: float = 0.0        # extra delay, uniform in [0, jitter]: reorders packets
    latency_s: float = 50e-6     # per hop
    rate_bps: float | None = None  # egress serialisation rate of every node
    seed: int = 0


@dataclass(order=True)
class _Event:
    time: float
    seq: int
    dst: Address = field(compare=False)
    src: Address = field(compare=False)
    data: bytes = field(compare=False)


@dataclass(frozen=True)
class Sniffed:
    """A datagram as a host on the wire sees it (what an observer is given)."""

    src: Address
    dst: Address
    data: bytes


class FakeNet:
    """Delivers datagrams between named nodes in virtual time. ``observers`` see every
    datagram sent (a sniffer on the wire); one may send datagrams of its own."""

    def __init__(self, cfg: NetConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.now = 0.0
        self._events: list[_Event] = []
        self._seq = 0
        self._link_free: dict[Address, float] = {}
        self.groups: dict[Address, list[Address]] = {}
        self.delivered = self.lost = self.duplicated = 0
        self.bytes_sent: dict[Address, int] = {}
        self.observers: list[Callable[[Sniffed], object]] = []

    def send(self, src: Address, dst: Address, data: bytes) -> None:
        for observe in list(self.observers):
            observe(Sniffed(src, dst, data))
        cfg = self.cfg
        self.bytes_sent[src] = self.bytes_sent.get(src, 0) + len(data)
        start = max(self.now, self._link_free.get(src, 0.0))
        done = start + (len(data) * 8 / cfg.rate_bps if cfg.rate_bps else 0.0)
        self._link_free[src] = done
        for target in self.groups.get(dst, [dst]):
            copies = 2 if self.rng.random() < cfg.duplicate else 1
            self.duplicated += copies - 1
            for _ in range(copies):
                if self.rng.random() < cfg.loss:
                    self.lost += 1
                    continue
                at = done + cfg.latency_s + self.rng.uniform(0, cfg.jitter_s)
                self._seq += 1
                heapq.heappush(self._events, _Event(at, self._seq, target, src, data))

    def next_time(self) -> float:
        return self._events[0].time if self._events else float("inf")

    def pop(self) -> _Event:
        ev = heapq.heappop(self._events)
        self.now = max(self.now, ev.time)
        self.delivered += 1
        return ev


@dataclass
class AggregateResult:
    outputs: list[np.ndarray]
    errors: list[str | None]
    time_s: float                 # virtual time until the last worker finished
    net: FakeNet
    dataplanes: list[Dataplane]
    retransmissions: int
    probes: int


def _switches(fnet: FakeNet, workers: list[Address], shards: int, window: int, k: int,
              multicast: bool, sparse_block: int, auth: int,
              dataplane: Callable[[JobTable], Dataplane] = Dataplane,
              ) -> tuple[list[Address], list[Dataplane], list[list[Shard]]]:
    """``shards`` switches on the fake net, each with the job registered (and live, as if
    every rank had attached): their addresses, dataplanes, and each worker's view of them
    (its own keys)."""
    addresses: list[Address] = [("10.0.255.254", 9570 + s) for s in range(shards)]
    dataplanes: list[Dataplane] = []
    views: list[list[Shard]] = [[] for _ in workers]
    for addr in addresses:
        table = JobTable(total_slots=window + 8, max_k=max_elements())
        job = table.register(workers, window, k, "fakenet",
                             multicast_port=7000 if multicast else None, block=sparse_block,
                             auth=auth)
        job.live = True
        dp = dataplane(table)
        dp.add_job(job)
        dataplanes.append(dp)
        for rank, view in enumerate(views):
            keys = JobKeys.derive(job.secret, job.job_id, job.auth, [rank])
            view.append(Shard(addr, job.job_id, window, Channel(keys, rank)))
        if job.group is not None:
            fnet.groups[job.group] = list(workers)
    return addresses, dataplanes, views


class _Workers:
    """The workers' side of one :func:`aggregate` run: one op at a time per worker."""

    def __init__(self, addresses: list[Address], inputs: list[np.ndarray], fnet: FakeNet,
                 shards: list[list[Shard]], k: int, timing: Timing, ops_per_worker: int,
                 sparse_block: int, threshold: float) -> None:
        self.addresses, self.inputs, self.fnet, self.shards = addresses, inputs, fnet, shards
        self.k, self.timing, self.sparse_block, self.threshold = k, timing, sparse_block, threshold
        n = len(inputs)
        self.seqs = [[[0] * s.slots for s in shards[0]] for _ in range(n)]
        self.outputs = [np.array(x, dtype=np.float32, copy=True) for x in inputs]
        self.errors: list[str | None] = [None] * n
        self.remaining = [ops_per_worker] * n
        self.ops: list[AllreduceOp | None] = [None] * n
        self.retransmissions = self.probes = 0

    def emit(self, src: Address, sends: list[tuple[Address, Parts]]) -> None:
        for dst, parts in sends:
            self.fnet.send(src, dst, b"".join(bytes(part) for part in parts))

    def start(self, i: int) -> None:
        n = len(self.inputs)
        self.outputs[i][:] = self.inputs[i]
        out = self.outputs[i]
        shards = self.shards[i]
        op = SparseAllreduceOp(out, out, i, n, self.k, shards, self.seqs[i], self.timing,
                               block=self.sparse_block, threshold=self.threshold) \
            if self.sparse_block else \
            AllreduceOp(out, out, i, n, self.k, shards, self.seqs[i], self.timing)
        self.ops[i] = op
        self.emit(self.addresses[i], op.start(self.fnet.now))
        if op.done:  # nothing to sum
            self.finish(i)

    def finish(self, i: int) -> None:
        op = self.ops[i]
        assert op is not None
        self.retransmissions += op.retransmissions
        self.probes += op.probes
        self.ops[i] = None
        if op.error is not None:
            self.errors[i] = str(op.error)
            self.remaining[i] = 0
            return
        self.remaining[i] -= 1
        if self.remaining[i]:
            self.start(i)

    def next_deadline(self) -> float:
        return min((op.next_deadline() for op in self.ops if op is not None),
                   default=float("inf"))

    def time_out(self) -> None:
        """Every op whose timer is due handles its timeout."""
        for i, op in enumerate(self.ops):
            if op is not None and op.next_deadline() <= self.fnet.now:
                self.emit(self.addresses[i], op.on_timeout(self.fnet.now))
                if op.done:
                    self.finish(i)

    def deliver(self, i: int, data: bytes, src: Address) -> None:
        op = self.ops[i]
        if op is None:
            return
        self.emit(self.addresses[i], op.on_datagram(data, src, self.fnet.now))
        if op.done:
            self.finish(i)


def aggregate(inputs: list[np.ndarray], k: int = 256, window: int = 4, shards: int = 1,
              net: NetConfig = NetConfig(), timing: Timing = Timing(),
              multicast: bool = True, max_time_s: float = 3600.0,
              before: Callable[[FakeNet, list[Dataplane]], None] | None = None,
              ops_per_worker: int = 1, sparse_block: int = 0,
              threshold: float = 0.0, auth: int = AUTH_MAC,
              dataplane: Callable[[JobTable], Dataplane] = Dataplane) -> AggregateResult:
    """Sum ``inputs`` (one float32 array per worker) through switches over a FakeNet.

    ``ops_per_worker`` consecutive all-reduces of the same inputs are run, as a trainer
    does step after step (slot sequence numbers continue across them). ``before`` may add
    extra traffic (e.g. a forger) before the run starts. ``sparse_block`` > 0 runs sparse
    streaming aggregation with blocks of that size. ``dataplane`` makes each switch's
    dataplane from its job table (the job is added afterwards, already live).
    """
    fnet = FakeNet(net)
    addresses: list[Address] = [(f"10.0.0.{i + 1}", 7000) for i in range(len(inputs))]
    switch_addrs, dataplanes, shard_list = _switches(fnet, addresses, shards, window, k,
                                                     multicast, sparse_block, auth, dataplane)
    if before is not None:
        before(fnet, dataplanes)
    run = _Workers(addresses, inputs, fnet, shard_list, k, timing, ops_per_worker, sparse_block,
                   threshold)
    for i in range(len(inputs)):
        run.start(i)
    index = {addr: i for i, addr in enumerate(run.addresses)}
    sw_index = {addr: s for s, addr in enumerate(switch_addrs)}
    while any(run.remaining) and fnet.now < max_time_s:
        deadline, t_event = run.next_deadline(), fnet.next_time()
        if deadline < t_event:
            fnet.now = max(fnet.now, deadline)
            run.time_out()
            continue
        if t_event == float("inf"):
            break
        ev = fnet.pop()
        if ev.dst in sw_index:
            run.emit(ev.dst, dataplanes[sw_index[ev.dst]].on_datagram(ev.data, ev.src, fnet.now))
        elif ev.dst in index:
            run.deliver(index[ev.dst], ev.data, ev.src)
    for i, op in enumerate(run.ops):
        if op is not None and run.errors[i] is None:
            run.errors[i] = f"not finished after {max_time_s} s of virtual time"
    return AggregateResult(run.outputs, run.errors, fnet.now, fnet, dataplanes,
                           run.retransmissions, run.probes)
