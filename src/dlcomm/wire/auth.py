"""Authenticated (and optionally encrypted) packets: keys, tags, replay windows (pure).

Every datagram of an authenticated job ends in a 16-byte tag (AES-128-GCM; docs/security.md):

- mode ``authenticated`` (the default): the tag is GMAC over the 32-byte header and the
  payload (AES-GCM with an empty plaintext and header + payload as associated data);
- mode ``encrypted``: the payload is AES-GCM ciphertext, the header associated data;
- mode ``none``: no tag; only the source address check stands (a trusted network).

Keys come from the job's 32-byte secret (made by the switch, handed to each rank over its
TLS control connection, never sent in clear) by HKDF-SHA256, one per sender and direction:
``up[r]`` for worker r -> switch, ``down[r]`` for the switch's packets to worker r alone
(status, errors, answers to a probe) and ``result`` for results, which go to every worker
(one multicast packet). The nonce is the sender's 64-bit packet counter (the header's
``counter``) and a stream number, never reused under one key: every key has one sender,
which counts up. A receiver keeps a :class:`ReplayWindow` per key, so a packet replayed,
even one that is authentic, is refused.

AES-GCM via the ``cryptography`` package (OpenSSL underneath, with AES-NI and carry-less
multiply): a 62 KB packet costs about 3 us to tag or check on this machine's CPU, HMAC-SHA256
about 50 us and a keyed BLAKE2b about 140 us (``dlcomm bench auth``; docs/security.md).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["AUTH_NONE", "AUTH_MAC", "AUTH_ENCRYPT", "AUTH_MODES", "AUTH_NAMES", "TAG_SIZE",
           "SECRET_SIZE", "JobKeys", "key_bytes", "all_key_bytes", "ReplayWindow", "Forged",
           "seal", "unseal", "STREAM_UP", "STREAM_DOWN", "STREAM_RESULT"]

AUTH_NONE, AUTH_MAC, AUTH_ENCRYPT = 0, 1, 2
AUTH_MODES = {"none": AUTH_NONE, "authenticated": AUTH_MAC, "encrypted": AUTH_ENCRYPT}
AUTH_NAMES = {v: k for k, v in AUTH_MODES.items()}
TAG_SIZE = 16
SECRET_SIZE = 32
STREAM_UP, STREAM_DOWN, STREAM_RESULT = 1, 2, 3   # the nonce's stream field, per direction
_NONCE = struct.Struct("<IQ")                       # stream (u32), counter (u64): 12 bytes


class Forged(ValueError):
    """A packet whose tag does not verify (forged, corrupted, or under another key)."""


def key_bytes(secret: bytes, job: int, label: bytes) -> bytes:
    """The 16-byte AES key of ``label`` (``up R``, ``down R``, ``result``) for a job."""
    return HKDF(algorithm=hashes.SHA256(), length=16, salt=job.to_bytes(4, "little"),
                info=b"dlcomm/1 " + label).derive(secret)


def all_key_bytes(secret: bytes, job: int, workers: int) -> bytes:
    """Every key of a job as the native dataplane takes them: up[0..n), down[0..n), result."""
    return b"".join([key_bytes(secret, job, b"up %d" % r) for r in range(workers)] +
                    [key_bytes(secret, job, b"down %d" % r) for r in range(workers)] +
                    [key_bytes(secret, job, b"result")])


@dataclass(frozen=True)
class JobKeys:
    """One job's packet keys (what a worker holds: its own up and down keys and the result
    key; the switch holds every rank's)."""

    mode: int
    up: dict[int, AESGCM]       # rank -> key of its packets to the switch
    down: dict[int, AESGCM]     # rank -> key of the switch's packets to it alone
    result: AESGCM | None       # key of results (every worker)
    # the same keys as bytes, by label ("up R", "down R", "result"): for the native code
    material: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def derive(cls, secret: bytes, job: int, mode: int, ranks: range | list[int]) -> JobKeys:
        """The keys of ``ranks`` (all of them for the switch, one for a worker)."""
        if mode not in AUTH_NAMES:
            raise ValueError(f"unknown authentication mode {mode}")
        if mode == AUTH_NONE:
            return cls(mode, {}, {}, None)
        if len(secret) != SECRET_SIZE:
            raise ValueError(f"a job secret has {SECRET_SIZE} bytes, got {len(secret)}")
        labels = [f"{d} {r}" for r in ranks for d in ("up", "down")] + ["result"]
        material = {label: key_bytes(secret, job, label.encode()) for label in labels}
        aead = {label: AESGCM(key) for label, key in material.items()}
        return cls(mode, {r: aead[f"up {r}"] for r in ranks},
                   {r: aead[f"down {r}"] for r in ranks}, aead["result"], material)


def seal(key: AESGCM, mode: int, stream: int, counter: int, packed: bytes | memoryview,
         header_size: int) -> bytes:
    """The tag (``authenticated``: over ``packed``, the header and payload as one buffer) or
    the ciphertext and tag of the payload (``encrypted``: the header is associated data)."""
    nonce = _NONCE.pack(stream, counter)
    if mode == AUTH_MAC:
        return key.encrypt(nonce, b"", packed)
    view = memoryview(packed)
    return key.encrypt(nonce, view[header_size:], view[:header_size])


def unseal(key: AESGCM, mode: int, stream: int, counter: int, datagram: memoryview,
           header_size: int) -> memoryview | bytes:
    """The payload of an authenticated datagram (header, payload, tag), or :class:`Forged`."""
    if len(datagram) < header_size + TAG_SIZE:
        raise Forged("too short for a tag")
    nonce = _NONCE.pack(stream, counter)
    body = datagram[: len(datagram) - TAG_SIZE]
    try:
        if mode == AUTH_MAC:
            key.decrypt(nonce, datagram[len(datagram) - TAG_SIZE:], body)
            return body[header_size:]
        return key.decrypt(nonce, datagram[header_size:], datagram[:header_size])
    except InvalidTag:
        raise Forged("tag does not verify") from None


class ReplayWindow:
    """Counters seen from one sender (highest, and a bitmap of the ``size`` below it): a
    counter is accepted once, and only if it is within the window (IPsec's scheme)."""

    __slots__ = ("size", "highest", "bits")

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.highest = -1
        self.bits = 0   # bit i: counter highest - i was seen

    def accept(self, counter: int) -> bool:
        """Whether ``counter`` is new (and mark it seen). Call only once the tag verified."""
        if counter > self.highest:
            shift = counter - self.highest
            self.bits = ((self.bits << shift) | 1) & ((1 << self.size) - 1) \
                if shift < self.size else 1
            self.highest = counter
            return True
        age = self.highest - counter
        if age >= self.size or (self.bits >> age) & 1:
            return False
        self.bits |= 1 << age
        return True
