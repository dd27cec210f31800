"""Datagrams an attacker would send a switch: random, mutated, forged, replayed (pure).

:class:`Mutator` makes them for one job whose numbers it knows (job, workers, slots, k,
block) and, optionally, whose keys it holds (a co-tenant attacking its own job reaches the
dataplane's deepest paths: rounds, exponents, values, sparse plans). Each datagram comes
with the rank whose registered address should send it (-1: any address). Kinds:

- ``random``: random bytes, any length up to 200;
- ``header``: a well-formed header with random fields and junk payload, no valid tag;
- ``sealed``: a plausible DATA packet (fields near the valid ranges, and beyond: seq
  0xFFFFFFFF, exponents of any int16, values up to the int32 extremes, random flags,
  sparse payloads whose look-ahead exponents take any int32), sealed with the rank's key;
- ``flipped``, ``truncated``, ``extended``: a sealed packet with one bit flipped, cut short,
  or with bytes appended (its tag no longer verifies, or its length is wrong);
- ``replayed``: a datagram seen before (one of this mutator's, or one fed to
  :meth:`Mutator.observe`, e.g. sniffed from an honest job);
- ``round`` (with keys only): the next coherent round of a random slot (not slot 0, where
  most ``sealed`` packets go, so that their chaos does not stall it) from every rank, in
  random order, sometimes with one packet bent out of range (exponent, value, slot, size,
  a jump of seq), sometimes a repeat of the slot's last round (retransmissions); a sparse
  job alternates announce rounds and the planned rounds they imply, so rounds complete
  and the deep paths (sums, plans, results, resends) are reached.

Everything comes from one seeded generator: a failing run is reproduced by its seed.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import numpy as np

from dlcomm.wire.channel import Channel
from dlcomm.wire.packet import (
    ANNOUNCE,
    CHALLENGE,
    DATA,
    ERROR,
    PROBE,
    RESEND,
    RESULT,
    SPARSE,
    STATUS,
    Header,
)
from dlcomm.wire.quant import EXP_NONFINITE, EXP_ZERO, value_limit
from dlcomm.wire.sparse import Blocks, data_width, pack_masks
from dlcomm.wire.sparse import decode as decode_sparse
from dlcomm.wire.sparse import encode as encode_sparse

__all__ = ["FuzzTarget", "Mutator", "KINDS"]

KINDS = ("random", "header", "sealed", "flipped", "truncated", "extended", "replayed",
         "round")
_WEIGHTS = (1, 1, 3, 1, 1, 1, 1, 6)
_INT32 = (-(1 << 31), (1 << 31) - 1)
_FLAGS = (0, 0, 0, PROBE, PROBE | RESEND, SPARSE, SPARSE | ANNOUNCE, 0xFF)


@dataclass(frozen=True)
class FuzzTarget:
    """What the attacker knows of one job."""

    job: int
    workers: int
    slots: int
    k: int
    block: int = 0                       # sparse block size (0: a dense job)
    channels: tuple[Channel, ...] = ()   # one per rank, if the attacker holds the keys


class Mutator:
    """Attack datagrams for one :class:`FuzzTarget` (module docstring)."""

    def __init__(self, target: FuzzTarget, seed: int, memory: int = 256) -> None:
        self.target = target
        self.rng = random.Random(seed)
        self.seen: deque[tuple[bytes, int]] = deque(maxlen=memory)
        self.made: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.queue: deque[tuple[bytes, int]] = deque()   # the current round's packets
        self.rounds = [0] * target.slots                   # next seq per slot
        self.last: dict[int, list[tuple[bytes, int]]] = {}  # slot -> its last round

    def observe(self, datagram: bytes, rank: int = -1) -> None:
        """Remember ``datagram`` (sent from ``rank``'s address) for later replay."""
        self.seen.append((datagram, rank))

    # -- fields ----------------------------------------------------------------------------
    def _pick(self, near: int, span: int) -> int:
        """Mostly within ``[0, near)``, sometimes anywhere in ``[0, span)``."""
        rng = self.rng
        return rng.randrange(max(1, near)) if rng.random() < 0.9 else rng.randrange(span)

    def _exponent(self) -> int:
        rng = self.rng
        return rng.choice((rng.randint(-160, 140), EXP_ZERO, EXP_NONFINITE,
                           rng.randint(-32768, 32767), 0))

    def _values(self, n: int, limit: int = (1 << 24), extremes: bool = True) -> np.ndarray:
        rng = self.rng
        np_rng = np.random.default_rng(rng.getrandbits(32))
        values = np_rng.integers(-limit, limit, n, dtype=np.int64)
        if n and extremes and rng.random() < 0.2:  # a value where a sum could wrap
            values[rng.randrange(n)] = rng.choice(_INT32)
        return values.astype(np.int32)

    def _sparse_payload(self, numel_hint: int) -> tuple[int, bytes]:
        """(numel, payload) of a sparse contribution with a random look-ahead."""
        t, rng = self.target, self.rng
        b = t.block or 4
        m = max(1, t.k // b)
        looks = rng.randrange(4)
        head = np.zeros((looks, 2 + data_width(m) - 2), np.int64)
        for i in range(looks):
            mask = np.array([[rng.random() < 0.5 for _ in range(m)]])
            head[i, :2] = (rng.randrange(64), rng.choice(
                (rng.randint(-150, 130), 100000, -(1 << 31), (1 << 31) - 1, EXP_ZERO)))
            head[i, 2:] = pack_masks(mask)[0]
        groups = sorted(rng.sample(range(64), rng.randrange(3)))
        mask = np.array([[rng.random() < 0.5 for _ in range(m)] for _ in groups],
                        dtype=bool).reshape(len(groups), m)
        values = self._values(int(mask.sum()) * b).reshape(-1, b)
        payload = encode_sparse(head, Blocks(np.array(groups, np.int64), mask, values))
        numel = values.size if rng.random() < 0.9 else min(0xFFFF, numel_hint)
        return numel, payload

    # -- datagrams -------------------------------------------------------------------------
    def _plausible(self) -> tuple[Header, bytes, int]:
        """A DATA header and payload near the job's valid ranges, from a random rank."""
        t, rng = self.target, self.rng
        rank = self._pick(t.workers, 0x10000)
        flags = rng.choice(_FLAGS)
        seq = rng.choice((rng.randrange(8), rng.randrange(64), 0xFFFFFFFF,
                          rng.getrandbits(32)))
        numel = t.k if rng.random() < 0.7 else self._pick(t.k + 1, 0x10000)
        if flags & SPARSE:
            numel, payload = self._sparse_payload(numel)
        elif flags & PROBE:
            payload = bytes(rng.randrange(4 * t.k + 64))
        else:
            payload = self._values(min(numel, t.k + 8)).tobytes()
        typ = DATA if rng.random() < 0.95 else rng.choice((RESULT, STATUS, ERROR, CHALLENGE))
        slot = 0 if rng.random() < 0.8 else rng.randrange(t.slots, 0x10000)  # rounds: 1..
        tsi = slot * t.k if rng.random() < 0.7 else self._pick(4 * t.k, 1 << 32)
        header = Header(typ, t.job, rank, slot, numel, seq, tsi, self._exponent(),
                        flags=flags)
        return header, payload, rank

    def _sealed(self) -> tuple[bytes, int]:
        header, payload, rank = self._plausible()
        channels = self.target.channels
        if channels:
            channel = channels[rank % len(channels)]
            datagram = b"".join(bytes(p) for p in channel.seal(header, payload))
        else:
            datagram = header.pack(self.rng.getrandbits(64)) + payload + bytes(16)
        send_rank = rank if rank < self.target.workers else -1
        self.observe(datagram, send_rank)
        return datagram, send_rank

    def _bend(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        """One field of a coherent packet pushed out of its range."""
        rng, t = self.rng, self.target
        field = rng.randrange(6)
        values = dict(slot=header.slot, numel=header.numel, seq=header.seq, exp=header.exp)
        if field == 0:
            values["exp"] = rng.choice((-32000, 200, 30000, -149))
        elif field == 1 and header.flags & SPARSE and header.numel:
            return header, self._sparse_beyond_limit(header, payload)
        elif field == 1:
            limit = value_limit(t.workers)
            return header, np.full(max(1, len(payload) // 4), rng.choice(
                (limit + 1, -limit - 1, *_INT32)), np.int32).tobytes()
        elif field == 2:
            values["slot"] = t.slots + rng.randrange(8)
        elif field == 3:
            values["numel"] = t.k + 1
        elif field == 4:
            values["seq"] = rng.choice((0xFFFFFFFF, header.seq + 4, header.seq + (1 << 20)))
        else:
            values["numel"] = max(0, header.numel - 1)   # the workers disagree: a mismatch
        return Header(header.type, header.job, header.worker, values["slot"],
                      values["numel"], values["seq"] & 0xFFFFFFFF, header.tsi,
                      values["exp"], flags=header.flags), payload

    def _sparse_beyond_limit(self, header: Header, payload: bytes) -> bytes:
        """A coherent sparse contribution with one value just beyond the job's limit."""
        t = self.target
        m = t.k // t.block
        head, part = decode_sparse(payload, header.numel, t.block, data_width(m))
        values = part.values.copy()
        limit = value_limit(t.workers)
        values.reshape(-1)[self.rng.randrange(values.size)] = self.rng.choice(
            (limit + 1, -limit - 1))
        return encode_sparse(head, Blocks(part.groups, part.mask, values))

    def _round_packets(self, slot: int, seq: int) -> list[tuple[Header, bytes]]:
        """Every rank's packet of round ``seq`` on ``slot``: dense, or for a sparse job an
        announce round (even seq) or the planned round it implies (odd seq)."""
        t, rng = self.target, self.rng
        exp = rng.randint(-20, 20)
        out = []
        if not t.block:
            for rank in range(t.workers):
                values = self._values(t.k, value_limit(t.workers) >> 4, False)
                out.append((Header(DATA, t.job, rank, slot, t.k, seq, slot * t.k, exp),
                            values.tobytes()))
            return out
        m = t.k // t.block
        union = np.zeros((1, m), bool)
        union[0, rng.randrange(m)] = True
        announce = seq % 2 == 0
        for rank in range(t.workers):
            mask = union | np.array([[rng.random() < 0.3 for _ in range(m)]])
            if announce:
                head = np.zeros((1, data_width(m)), np.int64)
                head[0, :2] = (slot, exp)
                head[0, 2:] = pack_masks(np.ones((1, m), bool) if rank == 0 else union)[0]
                payload, numel, flags = encode_sparse(head, Blocks.empty()), 0, SPARSE | ANNOUNCE
            else:
                keep = mask if rank == 0 else union
                values = self._values(int(keep.sum()) * t.block, 1000, False).reshape(
                    -1, t.block)
                payload = encode_sparse(np.zeros((0, data_width(m)), np.int64),
                                        Blocks(np.array([slot], np.int64), keep, values))
                numel, flags = values.size, SPARSE
            out.append((Header(DATA, t.job, rank, slot, numel, seq, 0, exp, flags=flags),
                        payload))
        return out

    def _next_round(self) -> None:
        """Queue a slot's next round (or a repeat of its last one)."""
        t, rng = self.target, self.rng
        slot = rng.randrange(1, t.slots) if t.slots > 1 else 0
        if slot in self.last and rng.random() < 0.25:
            self.queue.extend(self.last[slot])
            return
        seq = self.rounds[slot]
        self.rounds[slot] = (seq + 1) & 0xFFFFFFFF
        packets = self._round_packets(slot, seq)
        self.last[slot] = [self._seal(h, p) for h, p in packets]  # a repeat: unbent
        if rng.random() < 0.05:
            at = rng.randrange(len(packets))
            packets[at] = self._bend(*packets[at])
        rng.shuffle(packets)
        self.queue.extend(self._seal(h, p) for h, p in packets)

    def _seal(self, header: Header, payload: bytes) -> tuple[bytes, int]:
        channel = self.target.channels[header.worker]
        return b"".join(bytes(p) for p in channel.seal(header, payload)), header.worker

    def next(self) -> tuple[bytes, int]:
        """One attack datagram and the rank whose address should send it (-1: any)."""
        rng = self.rng
        kind = "round" if self.queue else rng.choices(KINDS, _WEIGHTS)[0]
        if kind == "replayed" and not self.seen:
            kind = "sealed"
        if kind == "round" and not self.target.channels:
            kind = "sealed"
        self.made[kind] += 1
        if kind == "round":
            if not self.queue:
                self._next_round()
            datagram, rank = self.queue.popleft()
            self.observe(datagram, rank)
            return datagram, rank
        datagram, rank = self._make(kind)
        if kind != "round" and rng.random() < 0.1:
            rank = -1   # from an address the job did not register
        return datagram, rank

    def _make(self, kind: str) -> tuple[bytes, int]:
        rng = self.rng
        if kind == "random":
            return rng.randbytes(rng.randrange(201)), -1
        if kind == "header":
            header, payload, rank = self._plausible()
            return header.pack(rng.getrandbits(64)) + payload[: rng.randrange(
                len(payload) + 1)], rank if rank < self.target.workers else -1
        if kind == "replayed":
            return rng.choice(self.seen)
        datagram, rank = self._sealed()
        if kind == "sealed":
            return datagram, rank
        if kind == "flipped":
            at = rng.randrange(len(datagram))
            return (datagram[:at] + bytes([datagram[at] ^ (1 << rng.randrange(8))])
                    + datagram[at + 1:]), rank
        if kind == "truncated":
            return datagram[: rng.randrange(len(datagram))], rank
        return datagram + rng.randbytes(rng.randrange(1, 65)), rank
