"""Seed inputs for the native fuzz harness (csrc/harness/fuzz_target.c), from the datagrams
the Python fuzz campaign sends (:class:`dlcomm.testing.fuzz.Mutator`) and honest rounds.

An input is a sequence of records: ``u8 selector, u16 little-endian length, bytes``. The
selector's low six bits choose the source address (:data:`RANKS` 0-2, :data:`A_SWITCH`,
:data:`A_STRANGER`, :data:`A_MIXED`); :data:`SEAL` asks the harness to seal the bytes
(header + plaintext payload) as their sender would, with the header's counter as the
nonce; :data:`CLIENT` delivers the record to the harness's client (rank 0 of :data:`J_MAC`)
instead of the switch. Every input starts from a fresh state, so each file here is one
self-contained story: one attacker's datagrams, honest rounds of three jobs, the switch's
answers to the client, or odd datagrams (the slow path, a job not live, foreign packets).

The fixed world below (jobs, addresses, :data:`FIXED_KEYS`) mirrors fuzz_target.c's
``JOBS``, ``ADDR_*`` and ``KEYS_MAC``/``KEYS_ENC``/``KEYS_SPARSE``: the two must match,
byte for byte (tests/native/test_sanitized.py compares the keys), or the seeds' tags do
not verify.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dlcomm.testing.fuzz import FuzzTarget, Mutator
from dlcomm.wire.auth import (
    AUTH_ENCRYPT,
    AUTH_MAC,
    AUTH_NONE,
    STREAM_UP,
    TAG_SIZE,
    Forged,
    JobKeys,
    unseal,
)
from dlcomm.wire.channel import Channel
from dlcomm.wire.packet import (
    CHALLENGE,
    COMPLETE,
    DATA,
    ERROR,
    HEADER_SIZE,
    PROBE,
    RESEND,
    RESULT,
    STATUS,
    SWITCH_RANK,
    Header,
    Malformed,
    decode_header,
)
from dlcomm.wire.quant import EXP_NONFINITE, EXP_ZERO, value_limit

__all__ = ["write_corpus", "record", "job_keys", "FIXED_KEYS", "SEAL", "CLIENT", "RANKS",
           "A_SWITCH", "A_STRANGER", "A_MIXED", "J_MAC", "J_NONE", "J_ENC", "J_SLOW",
           "J_IDLE", "J_SPARSE", "SLOTS", "K"]

SEAL, CLIENT = 0x80, 0x40
RANKS = (0, 1, 2)                       # address i is rank i's of every job
A_SWITCH, A_STRANGER, A_MIXED = 3, 4, 5  # the client's switch; anyone; rank 0's host, 1's port
J_MAC, J_NONE, J_ENC, J_SLOW, J_IDLE, J_SPARSE = 1, 2, 3, 4, 5, 6
WORKERS = {J_MAC: 3, J_NONE: 2, J_ENC: 3, J_SLOW: 3, J_IDLE: 2, J_SPARSE: 3}
MODES = {J_MAC: AUTH_MAC, J_NONE: AUTH_NONE, J_ENC: AUTH_ENCRYPT, J_SPARSE: AUTH_MAC}
SPARSE_BLOCK = 4                        # J_SPARSE's blocks: K / 4 = 4 per group
SLOTS, K = 4, 16
CLIENT_SLOTS, CLIENT_ELEMENTS = 2, 40   # the client's shard and op (fuzz_target.c)
CLIENT_DEADLINE_RECORDS = 100           # its deadline_s over the harness's step per record

# up[0..n), down[0..n), result: fuzz_target.c's KEYS_MAC and KEYS_ENC, byte for byte
FIXED_KEYS: dict[int, tuple[bytes, ...]] = {
    J_MAC: (b"fuzz j1 up 0....", b"fuzz j1 up 1....", b"fuzz j1 up 2....",
            b"fuzz j1 down 0..", b"fuzz j1 down 1..", b"fuzz j1 down 2..",
            b"fuzz j1 result.."),
    J_ENC: (b"fuzz j3 up 0....", b"fuzz j3 up 1....", b"fuzz j3 up 2....",
            b"fuzz j3 down 0..", b"fuzz j3 down 1..", b"fuzz j3 down 2..",
            b"fuzz j3 result.."),
    J_SPARSE: (b"fuzz j6 up 0....", b"fuzz j6 up 1....", b"fuzz j6 up 2....",
               b"fuzz j6 down 0..", b"fuzz j6 down 1..", b"fuzz j6 down 2..",
               b"fuzz j6 result.."),
}


def record(selector: int, data: bytes) -> bytes:
    """One record of a harness input."""
    if len(data) > 0xFFFF:
        raise ValueError(f"a record holds at most 65535 bytes, got {len(data)}")
    return struct.pack("<BH", selector, len(data)) + data


def job_keys(job: int) -> JobKeys:
    """The fixed keys of ``job`` as :class:`JobKeys` (every rank's: the switch's view)."""
    mode = MODES.get(job, AUTH_NONE)
    if mode == AUTH_NONE:
        return JobKeys(AUTH_NONE, {}, {}, None)
    n, raw = WORKERS[job], FIXED_KEYS[job]
    material = {**{f"up {r}": raw[r] for r in range(n)},
                **{f"down {r}": raw[n + r] for r in range(n)}, "result": raw[2 * n]}
    aead = {label: AESGCM(key) for label, key in material.items()}
    return JobKeys(mode, {r: aead[f"up {r}"] for r in range(n)},
                   {r: aead[f"down {r}"] for r in range(n)}, aead["result"], material)


def _int32(values: list[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


# -- the sources: each makes the records of one file -----------------------------------------
Source = Callable[[random.Random, int], list[bytes]]


def _authentic(keys: JobKeys, datagram: bytes, rank: int) -> bool:
    """Whether ``datagram`` is rank ``rank``'s, with a tag that verifies (mode authenticated)."""
    try:
        header = decode_header(datagram)
        if header.worker != rank or rank not in keys.up:
            return False
        unseal(keys.up[rank], AUTH_MAC, STREAM_UP, header.counter, memoryview(datagram),
               HEADER_SIZE)
    except (Malformed, Forged):
        return False
    return True


def _mutated(job: int, keyed: bool) -> Source:
    """The Python campaign's attacker on ``job`` (with or without its keys). Half of the
    authentic datagrams of mode authenticated go as SEAL records, their tag stripped: the
    harness seals them again, so that a fuzzer's mutations of them keep a valid tag. (Not
    the forged ones: sealed, a random counter would shut the replay window to the rest.)"""
    def make(rng: random.Random, n: int) -> list[bytes]:
        keys = job_keys(job)
        channels = tuple(Channel(keys, r) for r in range(WORKERS[job])) if keyed else ()
        block = SPARSE_BLOCK if job == J_SPARSE else 0
        mutator = Mutator(FuzzTarget(job, WORKERS[job], SLOTS, K, block, channels),
                          rng.getrandbits(32))
        out = []
        for i in range(n):
            datagram, rank = mutator.next()
            addr = rank if rank >= 0 else (A_MIXED if i % 9 == 0 else A_STRANGER)
            if keyed and keys.mode == AUTH_MAC and rng.random() < 0.5 and \
                    _authentic(keys, datagram, rank):
                out.append(record(SEAL | addr, datagram[:-TAG_SIZE]))
            else:
                out.append(record(addr, datagram))
        return out
    return make


def _round(rng: random.Random, job: int, slot: int, seq: int,
           counters: dict[tuple[int, int], int]) -> list[bytes]:
    """Every rank's SEAL record of one round of ``job`` on ``slot``, with retransmissions
    (refused as replays), probes (with RESEND: a result sent again) and losses."""
    out = []
    workers = WORKERS[job]
    numel = rng.choice((0, K, K // 2))
    exp = rng.choice((0, 3, -5, EXP_ZERO))
    limit = value_limit(workers) >> 4
    for rank in range(workers):
        counter = counters.get((job, rank), 0)
        counters[(job, rank)] = counter + 2
        values = [rng.randint(-limit, limit) for _ in range(numel)]
        header = Header(DATA, job, rank, slot, numel, seq, slot * K, exp)
        packet = record(SEAL | rank, header.pack(counter) + _int32(values))
        if rng.random() > 0.1:
            out.append(packet)
        if rng.random() < 0.1:
            out.append(packet)
        if rng.random() < 0.15:
            flags = PROBE | (RESEND if rng.random() < 0.5 else 0)
            pad = 4 * numel if flags & RESEND else (workers + 7) // 8
            probe = Header(DATA, job, rank, slot, numel, seq, slot * K, exp, flags=flags)
            out.append(record(SEAL | rank, probe.pack(counter + 1) + bytes(pad)))
    return out


def _honest(rng: random.Random, n: int) -> list[bytes]:
    """Rounds of the three native jobs interleaved, reordered a little; then the workers
    disagree on slot 0 (which the rounds leave alone): J_MAC about a chunk, J_NONE about
    the tensor's size. The jobs fail: ERRORs, then rate-limited ones."""
    out: list[bytes] = []
    counters: dict[tuple[int, int], int] = {}
    seqs = {(job, slot): 0 for job in MODES for slot in range(SLOTS) if slot or job == J_ENC}
    tail = [(J_MAC, 0, K, 0), (J_MAC, 1, K - 1, 0), (J_MAC, 1, K, 0), (J_MAC, 0, K, 0),
            (J_MAC, 0, K, 0), (J_NONE, 0, 0, 40), (J_NONE, 1, 0, 41)]
    while len(out) < n - len(tail):
        job, slot = rng.choice(sorted(seqs))
        out.extend(_round(rng, job, slot, seqs[(job, slot)], counters))
        seqs[(job, slot)] += 1
    del out[max(0, n - len(tail)):]
    for i in range(len(out) - 1):
        if rng.random() < 0.2:
            out[i], out[i + 1] = out[i + 1], out[i]
    for job, rank, numel, tsi in tail:
        counter = counters.get((job, rank), 0)
        counters[(job, rank)] = counter + 1
        header = Header(DATA, job, rank, 0, numel, 0, tsi, 0)
        out.append(record(SEAL | rank, header.pack(counter) + _int32([1] * numel)))
    return out[:n]


class _ClientModel:
    """What the harness's client waits for (client.c's positions for CLIENT_ELEMENTS floats,
    K per chunk, CLIENT_SLOTS slots): position i on slot i runs an exponent round (numel 0),
    then chunks i, i + 2, ...; a new op begins once all are done or the op failed."""

    def __init__(self) -> None:
        self.chunks = -(-CLIENT_ELEMENTS // K)
        self.seqs = [0] * CLIENT_SLOTS
        self.pos: list[list[int]] = []   # [slot, seq, numel, chunk (-1: exponents), done]
        self.begin()

    def begin(self) -> None:
        self.pos = []
        for slot in range(min(CLIENT_SLOTS, self.chunks)):
            self.pos.append([slot, self.seqs[slot], 0, -1, 0])
            self.seqs[slot] += 1

    def waiting(self) -> list[list[int]]:
        return [p for p in self.pos if not p[4]]

    def result(self, p: list[int]) -> None:
        nxt = p[0] if p[3] < 0 else p[3] + len(self.pos)
        if nxt >= self.chunks:
            p[4] = 1
        else:
            p[1], p[2], p[3] = self.seqs[p[0]], min(K, CLIENT_ELEMENTS - K * nxt), nxt
            self.seqs[p[0]] += 1
        if not self.waiting():
            self.begin()


STREAM_RESULT_KEY, STREAM_DOWN_KEY = "result", "down"   # the counters of the client's keys


def _client(rng: random.Random, n: int) -> list[bytes]:
    """The switch's answers to the client: results that complete its ops, statuses (one
    asks for a retransmission), replays, forgeries, strangers, errors, a NaN result; then
    silence, twice (the client gives up: stuck after a status, then without an answer)."""
    model = _ClientModel()
    out: list[bytes] = []
    counters = {STREAM_RESULT_KEY: 0, STREAM_DOWN_KEY: 0}
    quiet = CLIENT_DEADLINE_RECORDS + 5
    main = n - 2 * quiet - 1 if n > 4 * quiet else n
    while len(out) < main:
        out.extend(_client_step(rng, model, counters))
    del out[main:]
    if main < n:
        slot, seq = model.waiting()[0][:2]
        header = Header(STATUS, J_MAC, SWITCH_RANK, slot, 0, seq, 0, 0)
        out.append(_to_client(header, bytes([6]), counters, STREAM_DOWN_KEY))
        out.extend([record(0, b"")] * (2 * quiet))   # to the switch: the client hears nothing
    return out[:n]


def _client_step(rng: random.Random, model: _ClientModel,
                 counters: dict[str, int]) -> list[bytes]:
    """A datagram or two for one of the positions the client waits on."""
    p = rng.choice(model.waiting())
    slot, seq, numel = p[0], p[1], p[2]
    roll = rng.random()
    if roll < 0.15:
        flags = COMPLETE if rng.random() < 0.5 else 0
        header = Header(STATUS, J_MAC, SWITCH_RANK, slot, 0, seq, 0, 0, flags=flags)
        bitmap = bytes([rng.choice((1, 6, 7, 0))])
        return [_to_client(header, bitmap, counters, STREAM_DOWN_KEY)]
    if roll < 0.18 or roll > 0.99:   # the op fails: an ERROR, or a result that is NaN
        failing = roll < 0.18
        typ, exp = (ERROR, 0) if failing else (RESULT, EXP_NONFINITE)
        body = b"rank 1 sent chunk ..." if failing else _int32([0] * numel)
        header = Header(typ, J_MAC, SWITCH_RANK, slot, numel, seq, 0, exp)
        model.begin()
        return [_to_client(header, body, counters,
                           STREAM_DOWN_KEY if failing else STREAM_RESULT_KEY)]
    limit = value_limit(3) >> 4
    values = [rng.randint(-limit, limit) for _ in range(numel)]
    header = Header(RESULT, J_MAC, SWITCH_RANK, slot, numel, seq, 0, rng.randint(-20, 20))
    packet = _to_client(header, _int32(values), counters, STREAM_RESULT_KEY)
    model.result(p)
    if roll < 0.25:
        return [packet, packet]                                    # a replay: refused
    if roll < 0.3:
        return [packet, record(CLIENT | A_SWITCH, packet[3:])]     # no tag: forged
    if roll < 0.35:
        return [packet, record(CLIENT | SEAL | A_STRANGER, packet[3:])]
    return [packet]


def _to_client(header: Header, body: bytes, counters: dict[str, int], key: str) -> bytes:
    counter = counters[key]
    counters[key] = counter + 1
    return record(CLIENT | SEAL | A_SWITCH, header.pack(counter) + body)


def _odd(rng: random.Random, n: int) -> list[bytes]:
    """Datagrams of the slow path (J_SLOW) and of a job not live (J_IDLE), of unknown jobs,
    foreign, of other versions and types, short ones; from every address."""
    out = []
    for _ in range(n):
        job = rng.choice((J_SLOW, J_SLOW, J_IDLE, 0, 77, 0xFFFF, J_MAC, J_NONE))
        typ = rng.choice((DATA, DATA, RESULT, STATUS, ERROR, CHALLENGE, 0, 9))
        numel = rng.choice((0, 1, K, K + 1, 0xFFFF))
        header = Header(typ, job, rng.randrange(4), rng.randrange(6), numel,
                        rng.randrange(4), 0, rng.choice((0, EXP_ZERO, EXP_NONFINITE, 200)))
        datagram = header.pack(rng.getrandbits(64)) + _int32([7] * min(numel, K + 1))
        cut = rng.random()
        if cut < 0.1:
            datagram = datagram[: rng.randrange(48)]
        elif cut < 0.15:
            datagram = b"\x00\x01" + datagram[2:]          # foreign
        elif cut < 0.2:
            datagram = datagram[:2] + b"\x03" + datagram[3:]   # another version
        selector = rng.randrange(6) | (SEAL if rng.random() < 0.5 else 0)
        out.append(record(selector | (CLIENT if rng.random() < 0.1 else 0), datagram))
    return out


SOURCES: dict[str, Source] = {
    "mutator-mac-keys": _mutated(J_MAC, True),
    "mutator-mac": _mutated(J_MAC, False),
    "mutator-none-keys": _mutated(J_NONE, True),
    "mutator-enc-keys": _mutated(J_ENC, True),
    "mutator-sparse-keys": _mutated(J_SPARSE, True),
    "honest": _honest,
    "client": _client,
    "odd": _odd,
}


def write_corpus(directory: str | Path, count: int, seed: int) -> list[Path]:
    """Write about ``count`` records, split over one file per source (:data:`SOURCES`),
    into ``directory``; returns the files. The same seed writes the same bytes."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    share, extra = divmod(max(count, len(SOURCES)), len(SOURCES))
    paths = []
    for i, (name, source) in enumerate(SOURCES.items()):
        records = source(random.Random(rng.getrandbits(64)), share + (i < extra))
        path = root / f"{i:02d}-{name}"
        path.write_bytes(b"".join(records))
        paths.append(path)
    return paths
