"""Issue 16: a host that sees every packet of a job cannot change its result, end it, or
(encrypted) read a gradient value, against a live switch on loopback.

The on-path host (root: an ``AF_PACKET`` tap on ``lo`` and a raw IPv4 socket that writes its
own IP and UDP headers) watches every datagram of an honest job (3 worker threads that
all-reduce known tensors through the real switch exchange, one of them a little late to
each all-reduce, which leaves the others waiting for the first round's result: the window
in which a forged result would be taken), and while the job runs it

1. replays every datagram it saw: from its own socket, and with the sender's address forged,
   to where it went, to the switch and to every worker;
2. modifies them (a payload byte, the sequence number, slot, job, rank, type, its length)
   and sends them with the sender's address forged;
3. forges RESULT and ERROR packets from the switch's address to the workers, their headers
   copied from the round the worker waits for.

With the job's packets authenticated (or encrypted) every worker's every sum is exact, the
job runs on and the switch and workers count what they dropped; encrypted, no datagram
holds a quantized input value (which authenticated ones do: the check can fail). Without
authentication (``auth=none``) the same forged RESULT changes the sums and the same forged
ERROR ends the job: what the tags stop is real.

The workers are threads of the test (torch.distributed's two object collectives of the
bootstrap replaced by a barrier; everything else is the exchange's own code: TLS control
connections, challenges, keys, the window protocol on real UDP sockets).

What does end the job, as docs/security.md says ("What stays open"): a forged TCP RST into a
rank's control connection (its sequence numbers are on the wire; TLS cannot refuse a reset),
which the switch takes for a worker that left.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from dlcomm.wire.packet import (
    DATA,
    ERROR,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    RESULT,
    SWITCH_RANK,
    Header,
    Malformed,
    decode_header,
)
from dlcomm.wire.quant import chunk_exponents, quantize

WORLD = 3
NUMEL = 4000
K = 1000                 # 4 chunks: one per slot of the window
STRAGGLE_S = 0.03        # the last rank starts each all-reduce this much later
ATTACK_S = 3.0
FORGED_TEXT = "forged by the on-path host"
FORGED_EXP = 8           # a valid exponent, far above the inputs' (1)

Address = tuple[str, int]


# -- the honest job ------------------------------------------------------------------------
def known_input(rank: int, numel: int = NUMEL) -> np.ndarray:
    """Rank ``rank``'s tensor: multiples of 1/64 in [-1.5625, 1.5469], a different pattern
    per rank; quantized without rounding, so that the sum is exact."""
    i = np.arange(numel)
    return ((((i * 7 + rank * 13) % 200) - 100) / 64).astype(np.float32)


def expected_sum() -> np.ndarray:
    return np.sum([known_input(r) for r in range(WORLD)], axis=0, dtype=np.float32)


def plaintext_needles() -> list[bytes]:
    """The first 8 quantized values of every chunk of every rank's tensor and of the sum,
    as they would travel in a DATA or RESULT payload in clear (int32, little-endian)."""
    tensors = [known_input(r) for r in range(WORLD)]
    e_max = np.max([chunk_exponents(t, K) for t in tensors], axis=0)
    needles = set()
    for chunk, e in enumerate(e_max):
        lo = chunk * K
        quantized = [quantize(t[lo: lo + K], int(e), WORLD) for t in tensors]
        for q in [*quantized, np.sum(quantized, axis=0, dtype=np.int32)]:
            needles.add(q[:8].astype("<i4").tobytes())
    return sorted(needles)


class ThreadGroup:
    """The two object collectives of the switch exchange's bootstrap (all-gather, broadcast
    from rank 0) for worker threads of one process, in place of torch.distributed's: the
    rest of the exchange (TLS control, challenges, keys, the packet protocol) is real."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=30)
        self.values: list[Any] = [None] * world

    def all_gather(self, ctx: Any, value: Any) -> list[Any]:
        self.values[ctx.rank] = value
        self.barrier.wait()
        out = list(self.values)
        self.barrier.wait()
        return out

    def broadcast(self, ctx: Any, value: Any) -> Any:
        return self.all_gather(ctx, value)[0]


@dataclass
class HonestJob:
    """WORLD worker threads all-reducing their known tensor through the switch exchange
    until :meth:`finish`; every rank's report: all-reduces with the exact sum, with another
    one, the error that ended them, what its channel refused."""

    spec: str
    reports: list[dict[str, Any]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.group = ThreadGroup(WORLD)
        self.decision = [False]  # stop now? one answer per round for every rank
        self.rounds = threading.Barrier(WORLD, timeout=30,
                                        action=lambda: self.decision.__setitem__(
                                            0, self.stop.is_set()))
        self.reports = [{"rank": r, "exact": 0, "wrong": 0} for r in range(WORLD)]
        for rank in range(WORLD):
            thread = threading.Thread(target=self._rank, args=(rank,), daemon=True,
                                      name=f"honest-rank-{rank}")
            thread.start()
            self.threads.append(thread)

    def _rank(self, rank: int) -> None:
        import torch

        from dlcomm.exchange import ExchangeContext, make_exchange

        out = self.reports[rank]
        ex = None
        try:
            group: Any = self.group  # in place of a process group (the bootstrap's collectives)
            ctx = ExchangeContext(rank, WORLD, group=group, job_name="on-path")
            ex = make_exchange(self.spec, ctx)
            x, want = torch.from_numpy(known_input(rank)), torch.from_numpy(expected_sum())
            while True:
                self.rounds.wait()
                if self.decision[0]:
                    break
                if rank == WORLD - 1:
                    time.sleep(STRAGGLE_S)
                got = ex.allreduce(x.clone()).wait()
                if torch.equal(got, want):
                    out["exact"] += 1
                else:
                    out["wrong"] += 1
                    out["max_abs_error"] = max(out.get("max_abs_error", 0.0),
                                               float((got - want).abs().max()))
        except threading.BrokenBarrierError:
            out["error"] = "another rank stopped"
        except Exception as exc:  # noqa: BLE001 (reported to the test)
            out["error"] = str(exc).splitlines()[0]
            self.rounds.abort()
            self.group.barrier.abort()
        if ex is not None:
            stats = ex.transport.stats
            out["rejected"] = stats.malformed
            out["received"] = stats.packets_received
            ex.close()

    def finish(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout)
        assert not any(t.is_alive() for t in self.threads), self.reports
        return self.reports


@contextlib.contextmanager
def honest_job(live: Any, auth: str, deadline_s: float = 10.0) -> Iterator[HonestJob]:
    from dlcomm.exchange.switch import bootstrap

    host, port = live.address
    spec = (f"switch:addr={host}:{port},fp={live.fp},auth={auth},k={K},window=4,"
            f"deadline_s={deadline_s:g}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bootstrap, "_all_gather", lambda ctx, v: ctx.group.all_gather(ctx, v))
        patch.setattr(bootstrap, "_broadcast_from_first",
                      lambda ctx, v: ctx.group.broadcast(ctx, v))
        job = HonestJob(spec)
        try:
            yield job
        finally:
            job.finish()


# -- the on-path host ------------------------------------------------------------------------
ETH_P_ALL, ETH_P_IP, ETH_HEADER = 0x0003, 0x0800, 14
PACKET_OUTGOING = 4      # a loopback frame is seen going out and coming in: keep one copy
SO_ATTACH_FILTER = 26
IPPROTO_TCP, IPPROTO_UDP = 6, 17
TCP_FIN, TCP_SYN, TCP_RST = 0x01, 0x02, 0x04


def _port_filter(port: int) -> list[tuple[int, int, int, int]]:
    """Classic BPF for ``ip and (tcp or udp) and not a fragment and port PORT``."""
    return [(0x28, 0, 0, 12), (0x15, 0, 11, ETH_P_IP),        # ethertype IPv4
            (0x30, 0, 0, 23), (0x15, 1, 0, IPPROTO_UDP),       # protocol
            (0x15, 0, 8, IPPROTO_TCP),
            (0x28, 0, 0, 20), (0x45, 6, 0, 0x1FFF),           # not a fragment
            (0xB1, 0, 0, ETH_HEADER),                          # x = IP header length
            (0x48, 0, 0, ETH_HEADER), (0x15, 2, 0, port),      # source port
            (0x48, 0, 0, ETH_HEADER + 2), (0x15, 0, 1, port),  # destination port
            (0x06, 0, 0, 0x40000), (0x06, 0, 0, 0)]


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ip(src: str, dst: str, proto: int, body: bytes) -> bytes:
    # total length, id and checksum: the kernel fills them in (IP_HDRINCL)
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, 0, 0, 64, proto, 0, socket.inet_aton(src),
                       socket.inet_aton(dst)) + body


@dataclass(frozen=True)
class Datagram:
    src: Address
    dst: Address
    payload: bytes


@dataclass
class OnPath:
    """Sees every packet to and from the switch's port on ``lo``; sends what it likes, from
    any address it likes."""

    switch: Address
    tap: socket.socket
    raw: socket.socket
    plain: socket.socket
    seen: list[Datagram] = field(default_factory=list)
    seen_at: list[float] = field(default_factory=list)  # when each went past
    forged_at: dict[tuple[int, int, int, Address], float] = field(default_factory=dict)
    ranks: dict[int, Address] = field(default_factory=dict)  # as the DATA packets show
    tcp_next: dict[tuple[Address, Address], int] = field(default_factory=dict)
    sent: Counter[str] = field(default_factory=Counter)
    group_socks: list[socket.socket] = field(default_factory=list)
    _ours: Counter[Datagram] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def open(cls, switch: Address) -> OnPath:
        if os.geteuid() != 0:
            pytest.skip("needs root for AF_PACKET")
        try:
            tap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        except (OSError, AttributeError) as exc:
            pytest.skip(f"needs root for AF_PACKET ({exc})")
        try:
            program = b"".join(struct.pack("HBBI", *op) for op in _port_filter(switch[1]))
            buf = ctypes.create_string_buffer(program)
            fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buf))
            tap.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
            tap.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            tap.bind(("lo", 0))
            tap.settimeout(0.1)
            raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        except OSError as exc:
            tap.close()
            pytest.skip(f"needs root for AF_PACKET and raw sockets ({exc})")
        plain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        plain.bind(("127.0.0.1", 0))
        for sock in (raw, plain):  # what it sends to the job's group stays on loopback
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                            socket.inet_aton("127.0.0.1"))
        host = cls(switch, tap, raw, plain)
        host._start(host._sniff)
        return host

    def _start(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True, name="on-path")
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        for sock in (self.tap, self.raw, self.plain, *self.group_socks):
            sock.close()

    # -- seeing ----------------------------------------------------------------------------
    def _sniff(self) -> None:
        while not self._stop.is_set():
            try:
                frame, where = self.tap.recvfrom(1 << 17)
            except TimeoutError:
                continue
            if where[2] == PACKET_OUTGOING and len(frame) > ETH_HEADER + 20:
                self._frame(frame[ETH_HEADER:])

    def _frame(self, ip: bytes) -> None:
        ihl, total, proto = (ip[0] & 15) * 4, struct.unpack_from("!H", ip, 2)[0], ip[9]
        src_ip, dst_ip = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
        sport, dport = struct.unpack_from("!HH", ip, ihl)
        src, dst = (src_ip, sport), (dst_ip, dport)
        if proto == IPPROTO_UDP:
            d = Datagram(src, dst, ip[ihl + 8: total])
            with self._lock:
                if self._ours[d]:
                    self._ours[d] -= 1
                else:
                    self.seen.append(d)
                    self.seen_at.append(time.monotonic())
                    if dst == self.switch and len(d.payload) >= HEADER_SIZE:
                        fields = HEADER.unpack_from(d.payload)
                        if fields[0] == MAGIC and fields[2] == DATA:
                            self.ranks[fields[4]] = src
        elif proto == IPPROTO_TCP:
            seq, _ack, offset, flags = struct.unpack_from("!IIBB", ip, ihl + 4)
            length = total - ihl - (offset >> 4) * 4 + bool(flags & TCP_SYN) + \
                bool(flags & TCP_FIN)
            if not flags & TCP_RST:
                with self._lock:
                    self.tcp_next[(src, dst)] = (seq + length) & 0xFFFFFFFF

    def snapshot(self, start: int = 0) -> list[Datagram]:
        """The datagrams seen (from the ``start``-th on)."""
        with self._lock:
            return self.seen[start:]

    def early_forgeries(self) -> int:
        """Forged RESULTs that reached a worker before the switch's result of that round:
        while the worker still waited for it."""
        early = 0
        with self._lock:
            seen = list(zip(self.seen, self.seen_at))
            forged: dict[tuple[int, int, int], list[float]] = {}
            for (job, slot, seq, _), at in self.forged_at.items():
                forged.setdefault((job, slot, seq), []).append(at)
        for d, at in seen:
            if d.src == self.switch and len(d.payload) >= HEADER_SIZE:
                fields = HEADER.unpack_from(d.payload)
                if fields[0] == MAGIC and fields[2] == RESULT:
                    key = (fields[3], fields[5], fields[7], d.dst)  # job, slot, seq, to
                    if ipaddress.ip_address(d.dst[0]).is_multicast:  # to every worker
                        early += sum(t < at for t in forged.get(key[:3], []))
                    else:
                        early += self.forged_at.get(key, at) < at
        return early

    def join_group(self, group: str, port: int) -> None:
        """Receive a job's multicast results too (its workers share this host's group; the
        test is their user, whom ``SO_REUSEPORT`` lets share the group's port)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("", port))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                        socket.inet_aton(group) + socket.inet_aton("127.0.0.1"))
        self.group_socks.append(sock)

    # -- sending ---------------------------------------------------------------------------
    def inject(self, payload: bytes, src: Address, dst: Address, what: str) -> None:
        """``payload`` to ``dst`` in a UDP datagram whose source is ``src`` (forged)."""
        udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
        with self._lock:
            self._ours[Datagram(src, dst, payload)] += 1
        self.raw.sendto(_ip(src[0], dst[0], IPPROTO_UDP, udp), (dst[0], 0))
        self.sent[what] += 1

    def replay_plain(self, payload: bytes, dst: Address) -> None:
        """From the host's own socket (its real address)."""
        with self._lock:
            self._ours[Datagram(self.plain.getsockname(), dst, payload)] += 1
        self.plain.sendto(payload, dst)
        self.sent["replay from own address"] += 1

    def reset(self, src: Address, dst: Address, seq: int) -> None:
        """A TCP RST from ``src`` to ``dst`` at sequence number ``seq``."""
        tcp = struct.pack("!HHIIBBHHH", src[1], dst[1], seq, 0, 5 << 4, TCP_RST, 0, 0, 0)
        pseudo = socket.inet_aton(src[0]) + socket.inet_aton(dst[0]) + \
            struct.pack("!BBH", 0, IPPROTO_TCP, len(tcp))
        tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo + tcp)) + tcp[18:]
        self.raw.sendto(_ip(src[0], dst[0], IPPROTO_TCP, tcp), (dst[0], 0))
        self.sent["tcp reset"] += 1

    # -- attacking -------------------------------------------------------------------------
    def attack(self, moves: list[Callable[[OnPath, Datagram, Header], None]],
               seconds: float) -> None:
        """Apply every move to every datagram seen from now on, for ``seconds``: each move
        in its own thread, so that cheap ones (forgeries) keep up with the job."""
        start, deadline = len(self.snapshot()), time.monotonic() + seconds
        threads = [threading.Thread(target=self._apply, args=(move, start, deadline),
                                    daemon=True, name=f"on-path-{move.__name__}")
                   for move in moves]
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        for thread in threads:
            thread.join(10)

    def _apply(self, move: Callable[[OnPath, Datagram, Header], None], done: int,
               deadline: float) -> None:
        while time.monotonic() < deadline:
            fresh = self.snapshot(done)
            done += len(fresh)
            if not fresh:
                time.sleep(0.0005)
            for d in fresh:
                try:
                    hdr = decode_header(d.payload)
                except Malformed:
                    continue
                move(self, d, hdr)


def _tag_size(d: Datagram, hdr: Header) -> int:
    """What follows a dense DATA/RESULT's values: the tag (16 bytes), or nothing."""
    return len(d.payload) - HEADER_SIZE - 4 * hdr.numel


def _with(payload: bytes, hdr: Header, **fields: int) -> bytes:
    """``payload`` with header fields replaced (its counter kept)."""
    return replace(hdr, **fields).pack() + payload[HEADER_SIZE:]


def replay(host: OnPath, d: Datagram, hdr: Header) -> None:
    """Every datagram again: to where it went (forged source, and from the host's own
    address), and to every other party (the switch's packets to the switch, workers'
    packets to every worker as if from the switch)."""
    host.inject(d.payload, d.src, d.dst, "replay")
    if d.dst == host.switch:
        host.replay_plain(d.payload, d.dst)
        for addr in list(host.ranks.values()):
            host.inject(d.payload, host.switch, addr, "worker's packet to a worker")
    else:
        host.inject(d.payload, d.dst, host.switch, "switch's packet to the switch")


def modify(host: OnPath, d: Datagram, hdr: Header) -> None:
    """Every datagram changed, sent where it went with its sender's address forged (a
    change of rank: from that rank's address)."""
    p = d.payload
    at = HEADER_SIZE if len(p) > HEADER_SIZE else 16  # a value, or the header's tsi
    mutants = [("payload byte", p[:at] + bytes([p[at] ^ 1]) + p[at + 1:]),
               ("seq + 2", _with(p, hdr, seq=(hdr.seq + 2) & 0xFFFFFFFF)),
               ("seq - 1", _with(p, hdr, seq=(hdr.seq - 1) & 0xFFFFFFFF)),
               ("other slot", _with(p, hdr, slot=hdr.slot ^ 1)),
               ("slot out of range", _with(p, hdr, slot=0xFFF0)),
               ("other job", _with(p, hdr, job=hdr.job % 0xFFFE + 1)),
               ("exponent", _with(p, hdr, exp=FORGED_EXP)),
               ("truncated", p[:-5]),
               ("type error", _with(p, hdr, type=ERROR)),
               ("type result", _with(p, hdr, type=RESULT))]
    for what, payload in mutants:
        host.inject(payload, d.src, d.dst, f"modified: {what}")
    if d.dst == host.switch:
        other = host.ranks.get((hdr.worker + 1) % max(len(host.ranks), 1))
        if other is not None:  # another rank's contribution, from its address
            host.inject(_with(p, hdr, worker=(hdr.worker + 1) % len(host.ranks)), other,
                        d.dst, "modified: other rank")
        # as if it were the switch's result, to the worker that sent it
        host.inject(_with(p, hdr, worker=SWITCH_RANK, type=RESULT), host.switch, d.src,
                    "modified: as the switch's")


def forge_result(host: OnPath, d: Datagram, hdr: Header) -> None:
    """On a worker's DATA: a RESULT for the round it now waits for, from the switch's
    address, with the agreed-looking fields, other values (and a made-up tag if the job's
    packets carry tags)."""
    if d.dst != host.switch or hdr.type != DATA:
        return
    tag = os.urandom(_tag_size(d, hdr)) if _tag_size(d, hdr) > 0 else b""
    values = np.full(hdr.numel, 12345, "<i4").tobytes()
    forged = Header(RESULT, hdr.job, SWITCH_RANK, hdr.slot, hdr.numel, hdr.seq, hdr.tsi,
                    FORGED_EXP, counter=hdr.counter + 1_000_000)
    host.forged_at.setdefault((hdr.job, hdr.slot, hdr.seq, d.src), time.monotonic())
    host.inject(forged.pack() + values + tag, host.switch, d.src, "forged result")


def forge_error(host: OnPath, d: Datagram, hdr: Header) -> None:
    """On a worker's DATA: an ERROR for its round, from the switch's address."""
    if d.dst != host.switch or hdr.type != DATA:
        return
    tag = os.urandom(16) if _tag_size(d, hdr) > 0 else b""
    forged = Header(ERROR, hdr.job, SWITCH_RANK, hdr.slot, 0, hdr.seq, hdr.tsi, 0,
                    counter=hdr.counter + 1_000_000)
    host.inject(forged.pack() + FORGED_TEXT.encode() + tag, host.switch, d.src, "forged error")


def reset_one_control(host: OnPath) -> None:
    """A TCP RST into one rank's control connection to the switch, at the sequence number
    the switch expects next (the last segment seen from the rank: seq + length), a few
    times over, should the number move."""
    with host._lock:
        flow = next(f for f in host.tcp_next if f[1] == host.switch)
    for _ in range(3):
        with host._lock:
            seq = host.tcp_next[flow]
        host.reset(*flow, seq)
        time.sleep(0.1)


# -- running an attack -----------------------------------------------------------------------
@dataclass
class Outcome:
    reports: list[dict[str, Any]]   # every rank's
    seen: list[Datagram]            # every datagram the host saw (not its own)
    sent: Counter[str]              # what the host sent, by kind
    before: dict[str, Any]          # the switch's stats before the attack
    during: dict[str, Any]          # ... as it ended
    after: dict[str, Any]           # ... half a second later
    job: str
    early: int                      # forged RESULTs a worker had before the real one

    def grew(self, name: str) -> int:
        return int(self.during["counters"].get(name, 0) - self.before["counters"].get(name, 0))

    def job_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        return dict(stats["jobs"].get(self.job, {}))


def _live_job(live: Any, timeout: float = 30.0) -> str:
    """The job's number once it is live and has completed some rounds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job_id, job in live.server.stats()["jobs"].items():
            if job["live"] and job.get("completions", 0) >= 20:
                return str(job_id)
        time.sleep(0.05)
    raise AssertionError(f"no job went live and completed rounds: {live.server.stats()}")


def run_attack(auth: str, moves: list[Callable[[OnPath, Datagram, Header], None]],
               deadline_s: float = 10.0, then: Callable[[OnPath], None] | None = None,
               attack_s: float = ATTACK_S) -> Outcome:
    """An honest job on a live switch, attacked by an on-path host for ``attack_s``."""
    from tests.switch.live import live_switch

    with live_switch() as live:
        host = OnPath.open(live.address)
        try:
            with honest_job(live, auth, deadline_s) as job:
                job_id = _live_job(live)
                group = live.server.state.table.jobs[int(job_id)].group
                if group is not None:  # results by multicast: receive them too
                    host.join_group(*group)
                before = live.server.stats()
                host.attack(moves, attack_s)
                if then is not None:
                    then(host)
                during = live.server.stats()
                time.sleep(0.5)  # the job runs on (or not)
                after = live.server.stats()
                reports = job.finish()
            return Outcome(reports, host.snapshot(), host.sent, before, during, after, job_id,
                           host.early_forgeries())
        finally:
            host.close()


def holds_plaintext(seen: list[Datagram]) -> bool:
    needles = plaintext_needles()
    return any(n in d.payload for d in seen for n in needles)


def _assert_unharmed(out: Outcome) -> None:
    """Every rank summed exactly, as often as every other, without an error; the job is
    live, not failed, and completed rounds after the attack."""
    for r in out.reports:
        assert "error" not in r, out.reports
        assert r["wrong"] == 0 and r["exact"] > 10, out.reports
    assert len({r["exact"] for r in out.reports}) == 1, out.reports
    during, after = out.job_stats(out.during), out.job_stats(out.after)
    assert after.get("live") and not after.get("failure"), after
    assert not out.after["counters"].get("control_jobs_failed"), out.after["counters"]
    assert after["completions"] > during["completions"], (during, after)


# -- the tests -------------------------------------------------------------------------------
pytestmark = [pytest.mark.root,
              pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                 reason="needs root for AF_PACKET")]


@pytest.fixture(autouse=True)
def frames_as_on_a_wire(monkeypatch):
    """A tap on loopback sees GSO batches whole, which a wire never carries (the kernel or
    the NIC cuts them into frames first): the native loops send datagram by datagram here."""
    monkeypatch.setenv("DLCOMM_GSO", "off")


@pytest.mark.parametrize("auth", ["authenticated", "encrypted"])
def test_on_path_host_cannot_change_end_or_read_a_job(auth):
    """Replays, modifications and forged RESULT/ERROR packets from a host that sees every
    packet: every sum stays exact, the job runs on, every forgery is dropped and counted;
    encrypted, no input value is readable."""
    out = run_attack(auth, [replay, modify, forge_result, forge_error])
    _assert_unharmed(out)
    sent = sum(out.sent.values())
    assert sent > 2000 and out.sent["forged result"] > 20 and out.sent["forged error"] > 20, \
        out.sent
    assert out.early > 20, out.early  # forged results a worker had while it waited
    # the switch dropped what reached it, each for its reason
    for reason in ("drop_replay", "drop_bad_tag", "drop_bad_source", "drop_unknown_job",
                   "drop_bad_slot", "drop_type"):
        assert out.grew(reason) > 0, (reason, out.before, out.during)
    assert out.grew("drop_replay") >= out.sent["replay"] // 4, (out.sent, out.during)
    # the workers refused the forgeries and replays sent to them
    assert all(r["rejected"] > 50 for r in out.reports), out.reports
    # and what the host read: every chunk of the job went past it
    assert sum(len(d.payload) >= HEADER_SIZE + 4 * K for d in out.seen) > 100, len(out.seen)
    assert holds_plaintext(out.seen) == (auth == "authenticated")


def test_without_authentication_a_forged_result_changes_the_sum():
    """The same forged RESULTs in a job without tags (``auth=none``) are taken: the sums
    change (which shows the exactness check above can fail)."""
    out = run_attack("none", [forge_result], deadline_s=2)
    assert out.early > 20, out.early
    assert sum(r["wrong"] for r in out.reports) > 0, out.reports
    assert holds_plaintext(out.seen)


def test_without_authentication_a_forged_error_ends_the_job():
    """The same forged ERRORs in a job without tags end it."""
    out = run_attack("none", [forge_error], deadline_s=2)
    assert any(FORGED_TEXT in r.get("error", "") for r in out.reports), out.reports
    assert all("error" in r for r in out.reports), out.reports


def test_a_forged_tcp_reset_ends_the_job_as_documented():
    """What stays open (docs/security.md): TLS cannot refuse a forged TCP RST, whose
    sequence number an on-path host reads off the wire. One into a rank's control connection
    ends the job, and the other ranks hear ``worker_left`` naming that rank."""
    out = run_attack("encrypted", [], deadline_s=2, then=reset_one_control, attack_s=0.2)
    assert out.sent["tcp reset"] >= 1
    counters = out.after["counters"]
    assert counters.get("control_connection_errors", 0) >= 1, counters
    assert counters.get("control_jobs_failed") == 1 and out.job not in out.after["jobs"]
    named = [m.group(1) for r in out.reports
             if (m := re.search(r"worker rank (\d+) left the job", r.get("error", "")))]
    assert len(named) == WORLD - 1 and len(set(named)) == 1, out.reports
    assert all("error" in r for r in out.reports), out.reports
