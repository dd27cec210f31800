"""The worker's side of the aggregation protocol as a pure state machine (no sockets).

One :class:`AllreduceOp` sums a float32 tensor over all workers through one or more
switch shards. The tensor is cut into chunks of k elements; the job's slots on every shard
form a window of P positions, and chunk j uses position j mod P (positions alternate
between shards, so shards share the load). Per position (docs/references.md: SwitchML):

1. an exponent-only round (no payload) announces the exponent of the position's first
   chunk (and, in ``tsi``, the tensor's length, so that workers whose tensors differ fail
   at once); the switch answers with the maximum over workers;
2. each data round sends the position's chunk quantized with that agreed exponent and
   announces the exponent of the position's next chunk (one round ahead);
3. the result is dequantized into the output and the position moves on to chunk j + P
   (self-clocking: a slot is reused only after its result came back).

When a position's result does not arrive before its retransmission timeout, the worker
sends a PROBE (a header, padded to the size of the answer: the switch never answers with
more bytes than it gets); the switch answers with a STATUS bitmap of who has contributed,
flagged COMPLETE once the round is complete. If the bitmap lacks this worker (its packet
was lost), the payload is sent again at once, with the same sequence number so the switch
recognises a retransmission. If the round was complete, the result is on its way or lost:
the next probe, about one round trip later, asks the switch to RESEND it. If it was still
waiting for other workers, the next probe waits twice as long, up to four times the base
timeout (only the result can still be lost; stragglers are not hurried by probes), and
until that shard sends a result, a complete STATUS or one lacking this worker, only one
position of the shard probes per timeout: the others hold their probes as long (a late
worker would otherwise draw a probe and a STATUS from every position of every early
worker, packets the switch and the late worker's cores have to handle). The
timeout is four times the smallest recent round trip and at least twice the median one
(:class:`RttEstimator`; rounds that were probed give no sample), doubled on every timeout
that got no answer. If no result arrives for ``deadline_s``, the op fails naming the ranks
the switch is still waiting for.

Every datagram goes out sealed and comes in checked by the shard's
:class:`~dlcomm.wire.channel.Channel` (the job's keys for this rank, the counters, the
replay windows): :meth:`AllreduceOp.on_datagram` drops whatever does not verify, ERRORs
included, so no host without the job's keys can end, stall or poison an op.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from dlcomm.errors import ExchangeError, ExchangeTimeout
from dlcomm.exchange.switch.timing import RttEstimator, Timing
from dlcomm.wire.channel import Channel, Forged, Parts, Replayed
from dlcomm.wire.packet import (
    COMPLETE,
    DATA,
    ERROR,
    PROBE,
    RESEND,
    RESULT,
    SPARSE,
    STATUS,
    Header,
    Malformed,
    check_length,
    decode_header,
)
from dlcomm.wire.quant import EXP_NONFINITE, EXP_ZERO, chunk_exponents, dequantize_into, quantize

__all__ = ["Shard", "Timing", "RttEstimator", "AllreduceOp", "Send", "switch_error",
           "nonfinite_error", "stuck_error", "no_answer_error", "send_error"]

Address = tuple[str, int]
Send = tuple[Address, Parts]   # a sealed datagram and where it goes


@dataclass(frozen=True)
class Shard:
    """One switch process serving part of the job, and this rank's channel to it."""

    address: Address
    job: int
    slots: int
    channel: Channel


@dataclass
class _Position:
    index: int                       # place in the window; its first chunk
    shard: int
    slot: int
    chunk: int = -1                  # -1: the exponent round
    seq: int = 0
    e_used: int = EXP_ZERO           # exponent the in-flight chunk was quantized with
    header: Header | None = None
    payload: np.ndarray | None = None
    sent_at: float = 0.0
    deadline: float = 0.0
    retries: int = 0
    done: bool = False
    missing: int | None = None       # bitmap of ranks the round waits for (last STATUS)
    complete_seen: bool = False      # a STATUS said the round is complete
    probed: bool = False             # a probe went out this round: no round-trip sample
    waits: int = 0                   # STATUS answers that only others were missing

    def new_round(self) -> None:
        self.retries, self.missing, self.complete_seen, self.probed, self.waits = \
            0, None, False, False, 0


@dataclass
class AllreduceOp:
    """Sum ``data`` over ``workers`` into ``out`` (which may be ``data`` itself)."""

    data: np.ndarray
    out: np.ndarray
    rank: int
    workers: int
    k: int
    shards: list[Shard]
    seqs: list[list[int]]            # per shard, per slot: the job's next sequence number
    timing: Timing = field(default_factory=Timing)
    rtt: RttEstimator | None = None  # shared across ops (the transport's); None: a new one

    def __post_init__(self) -> None:
        if self.data.dtype != np.float32 or self.out.dtype != np.float32:
            raise ExchangeError("the switch exchange sums float32 tensors")
        self.timer = self.rtt or RttEstimator(self.timing)
        self.chunks = -(-len(self.data) // self.k)
        prepared = self._prepare()
        self.exps: np.ndarray = prepared if prepared is not None else (
            chunk_exponents(self.data, self.k) if self.chunks else np.zeros(0, np.int32))
        order = [(s, slot) for slot in range(max(sh.slots for sh in self.shards))
                 for s, sh in enumerate(self.shards) if slot < sh.slots]
        self.positions = [_Position(i, s, slot) for i, (s, slot) in enumerate(order[: self.chunks])]
        self.error: ExchangeError | None = None
        self.last_progress = 0.0
        self.retransmissions = 0
        self.probes = 0
        self.rejected = 0  # datagrams that did not verify (forged, replayed, malformed)
        # per shard: the wait its last STATUS set while only others were missing (one
        # position probes for the shard, the rest hold), None when every position probes
        self.holding: list[float | None] = [None] * len(self.shards)
        self._by_slot = {(p.shard, p.slot): p for p in self.positions}
        bad = np.flatnonzero(self.exps == EXP_NONFINITE)
        self.local_nonfinite = int(bad[0]) * self.k if len(bad) else None

    def _prepare(self) -> np.ndarray | None:
        """Hook for modes that change the data before exponents are taken (sparse); it may
        return the chunk exponents it computed on the way."""
        return None

    @property
    def done(self) -> bool:
        return self.error is not None or all(p.done for p in self.positions)

    def _tsi(self, chunk: int) -> int:
        return chunk * self.k

    def _next_exp(self, chunk: int) -> int:
        return int(self.exps[chunk]) if chunk < self.chunks else EXP_ZERO

    def _send(self, pos: _Position, now: float, probe: bool = False) -> Send:
        shard = self.shards[pos.shard]
        pos.sent_at = now
        pos.deadline = now + self.timer.timeout(pos.retries)
        assert pos.header is not None
        if probe:
            pos.probed = True
            resend = pos.complete_seen
            flags = pos.header.flags | PROBE | (RESEND if resend else 0)
            padding = bytes(self._answer_size(pos) if resend else (self.workers + 7) // 8)
            return (shard.address, shard.channel.seal(replace(pos.header, flags=flags),
                                                      padding))
        body = pos.payload.data.cast("B") if pos.payload is not None else b""
        return (shard.address, shard.channel.seal(pos.header, body))

    def _answer_size(self, pos: _Position) -> int:
        """The payload bytes of the result a RESEND asks for (a probe pads to them)."""
        assert pos.header is not None
        return 4 * pos.header.numel

    def _arm(self, pos: _Position, chunk: int, e_max: int, now: float,
             next_exp: int | None = None) -> Send:
        """Prepare and send the round for ``chunk`` (or the exponent round if chunk < 0)."""
        shard = self.shards[pos.shard]
        pos.seq = self.seqs[pos.shard][pos.slot]
        self.seqs[pos.shard][pos.slot] += 1
        pos.new_round()
        if chunk < 0:  # exponent round for the position's first chunk
            pos.chunk, pos.payload = -1, None
            # tsi carries the tensor's length: workers whose tensors differ disagree here,
            # in the first round, and the switch tells every one of them.
            pos.header = Header(DATA, shard.job, self.rank, pos.slot, 0, pos.seq,
                                len(self.data) & 0xFFFFFFFF, self._next_exp(pos.index))
        else:
            lo, hi = self._tsi(chunk), min(self._tsi(chunk) + self.k, len(self.data))
            pos.chunk, pos.e_used = chunk, e_max
            pos.payload = quantize(self.data[lo:hi], e_max, self.workers)
            announce = self._next_exp(chunk + len(self.positions)) if next_exp is None \
                else next_exp
            pos.header = Header(DATA, shard.job, self.rank, pos.slot, hi - lo, pos.seq, lo,
                                announce)
        return self._send(pos, now)

    def start(self, now: float) -> list[Send]:
        """The exponent rounds of every position. A worker whose tensor holds NaN/Inf still
        takes part: it announces EXP_NONFINITE, so every worker fails the same way."""
        self.last_progress = now
        return [self._arm(p, -1, EXP_ZERO, now) for p in self.positions]

    def allow_skew(self, seconds: float) -> None:
        """Let the first rounds wait ``seconds`` longer before they probe: the time this
        worker took to prepare the op, which the others are spending on the same pass over
        their tensors (probing them meanwhile only loads the switch)."""
        for pos in self.positions:
            pos.deadline += seconds

    def on_datagram(self, data: bytes | bytearray | memoryview, src: Address, now: float
                    ) -> list[Send]:
        """Handle a datagram from a switch (checked by the shard's channel); return what to
        send next. What does not verify is dropped and counted in ``rejected``."""
        try:
            hdr = decode_header(data)
        except Malformed:
            self.rejected += 1
            return []
        shard = self._shard_of(src, hdr)
        if shard < 0:
            self.rejected += 1
            return []
        try:
            payload = self.shards[shard].channel.open(hdr, memoryview(data))
            check_length(hdr, payload)
        except (Forged, Replayed, Malformed):
            self.rejected += 1
            return []
        return self.on_packet(hdr, payload, src, now, shard)

    def on_packet(self, hdr: Header, payload: memoryview | bytes, src: Address, now: float,
                  shard: int) -> list[Send]:
        """Handle an authentic packet from ``shard``; return what to send next."""
        pos = self._by_slot.get((shard, hdr.slot))
        if pos is None or pos.done or self.error is not None:
            return []
        if hdr.type == ERROR:
            self.error = switch_error(src, bytes(payload))
            return []
        if hdr.seq != pos.seq:
            return []  # a duplicate of an earlier round
        if hdr.type == STATUS:
            pos.missing = int.from_bytes(bytes(payload), "little")
            pos.complete_seen |= bool(hdr.flags & COMPLETE)  # a late older STATUS: still so
            pos.retries = 0  # the switch answered: no reason to back off further
            self.holding[shard] = None
            if (pos.missing >> self.rank) & 1:
                self.retransmissions += 1  # the switch lacks our packet: send it again
                return [self._send(pos, now)]
            rtt = self.timer
            # complete: the result is on its way or lost; ask again (RESEND) after about one
            # round trip. Otherwise others are still missing (stragglers, or peers recovering
            # a loss): our part is in, only the result could still be lost, so probe less
            # often the longer they take (up to 4x the base timeout: a lost result then
            # waits at most that long).
            if pos.complete_seen:
                wait = max(self.timing.min_timeout_s, rtt.srtt or 0.0)
            else:
                pos.waits += 1
                wait = rtt.timeout(min(pos.waits, 2))
                self.holding[shard] = wait
            pos.deadline = now + wait
            return []
        if hdr.type != RESULT:
            return []
        if hdr.exp == EXP_NONFINITE:
            self._nonfinite()
            return []
        sent_at, probed = pos.sent_at, pos.probed  # the result arms the next round
        sends = self._on_result(pos, hdr, payload, now)
        if sends is None:
            return []  # not a result of this round after all
        self.holding[shard] = None
        if not probed:  # Karn: a probed round's time is not a round trip
            self.timer.sample(now - sent_at)
        self.last_progress = now
        return sends

    def _nonfinite(self) -> None:
        self.error = nonfinite_error(self.rank, self.local_nonfinite)

    def _on_result(self, pos: _Position, hdr: Header, payload: memoryview | bytes,
                   now: float) -> list[Send] | None:
        """Dense: dequantize the chunk's sum, move the position to its next chunk."""
        if pos.header is None or hdr.flags & SPARSE or hdr.numel != pos.header.numel or \
                len(payload) != 4 * hdr.numel:   # a RESULT flagged PROBE skips check_length
            return None
        if pos.chunk >= 0:
            lo = pos.header.tsi
            dequantize_into(self.out[lo: lo + hdr.numel],
                            np.frombuffer(payload, dtype=np.int32), pos.e_used, self.workers)
            nxt = pos.chunk + len(self.positions)
        else:
            nxt = pos.index
        if nxt >= self.chunks:
            pos.done = True
            return []
        return [self._arm(pos, nxt, hdr.exp, now)]

    def _shard_of(self, src: Address, hdr: Header) -> int:
        for i, sh in enumerate(self.shards):
            if sh.address == src and sh.job == hdr.job:
                return i
        return -1

    def next_deadline(self) -> float:
        pending = [p.deadline for p in self.positions if not p.done]
        return min(pending) if pending else float("inf")

    def on_timeout(self, now: float) -> list[Send]:
        """Probe every position whose timeout passed (one per shard that only waits for
        others; the rest hold); fail after ``deadline_s``."""
        if now - self.last_progress > self.timing.deadline_s:
            self.error = self._stuck_error(now)
            return []
        out = []
        probed = set()
        for pos in self.positions:
            if not pos.done and pos.deadline <= now:
                hold = self.holding[pos.shard]
                if hold is not None and pos.shard in probed:
                    pos.deadline = now + hold
                    continue
                probed.add(pos.shard)
                pos.retries += 1
                self.probes += 1
                out.append(self._send(pos, now, probe=True))
        return out

    def _stuck_error(self, now: float) -> ExchangeTimeout:
        stuck = [p for p in self.positions if not p.done]
        known = [(p, p.missing) for p in stuck if p.missing]
        idle = now - self.last_progress
        if known:
            p, bitmap = known[0]
            missing = [r for r in range(self.workers) if (bitmap >> r) & 1]
            return stuck_error(self.shards[p.shard].address, idle, missing, p.slot, p.seq)
        return no_answer_error(self.shards[stuck[0].shard].address if stuck else ("?", 0), idle)


# -- the op's failures, as both clients (this one and dlcomm.native.client) report them ---
def switch_error(src: Address, payload: bytes) -> ExchangeError:
    """The switch's ERROR (its text; an empty one: the job is unknown to it)."""
    text = payload.decode(errors="replace") or \
        "unknown job (the switch restarted or the job ended)"
    return ExchangeError(f"switch {src[0]}:{src[1]}: {text}")


def nonfinite_error(rank: int, element: int | None) -> ExchangeError:
    where = (f"this worker (rank {rank}) near element {element}" if element is not None
             else "another worker")
    return ExchangeError(f"a gradient holds NaN or Inf ({where}); the switch exchange "
                         "refuses to sum it")


def stuck_error(addr: Address, idle_s: float, missing: list[int], slot: int,
                seq: int) -> ExchangeTimeout:
    return ExchangeTimeout(
        f"no progress for {idle_s:.1f} s: the switch at {addr[0]}:{addr[1]} is still "
        f"waiting for rank(s) {', '.join(map(str, missing))} (slot {slot}, round {seq})")


def no_answer_error(addr: Address, idle_s: float) -> ExchangeTimeout:
    return ExchangeTimeout(f"no answer from the switch at {addr[0]}:{addr[1]} for "
                           f"{idle_s:.1f} s (is it running and reachable?)")


def send_error(addr: Address, reason: str) -> ExchangeError:
    """A datagram to the switch the kernel refused (the system's reason: a firewall, no
    route, a bad address)."""
    return ExchangeError(f"cannot send to the switch at {addr[0]}:{addr[1]}: {reason}")
