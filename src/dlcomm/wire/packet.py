"""Packets of the aggregation protocol (SwitchML-style; docs/references.md).

Every packet is one UDP datagram: a 32-byte little-endian header, a payload and, in an
authenticated job, a 16-byte tag (:mod:`dlcomm.wire.auth`; docs/security.md).

    magic   u16   0xD1C0 (anything else is a foreign packet)
    version u8    2
    type    u8    DATA (worker -> switch), RESULT, STATUS, ERROR, CHALLENGE (switch -> worker)
    job     u16   job number given by the switch's control channel
    worker  u16   the sender's rank in the job (0xFFFF from the switch)
    slot    u16   slot index within the job's range of slots
    numel   u16   int32 elements in the payload (0: an exponent-only round)
    seq     u32   how many times the job has used this slot; seq mod 2 is the slot's copy
    tsi     u32   tensor start index: element offset of the chunk in the tensor
    exp     i16   DATA: exponent of the sender's *next* chunk on this slot (one round ahead);
                  RESULT: the maximum of those over all workers
    flags   u8    DATA: PROBE (0x01) a header-only packet asking whether the switch holds the
                  sender's contribution for (slot, seq); with RESEND (0x02) it also asks for
                  the result to be sent again if the round is complete.
                  STATUS: COMPLETE (0x04) the round is complete (its result was multicast).
                  DATA/RESULT: SPARSE (0x08) the payload is a sparse group (wire/sparse.py).
                  RESULT: RUN (0x10) with SPARSE: the planned groups are full on every worker
                  and follow as plain dense rounds (wire/sparse.py).
                  DATA: ANNOUNCE (0x20) with SPARSE: a round that only announces look-aheads.
    resv    u8    0
    counter u64   the sender's packet counter on this key: the tag's nonce, and what a
                  receiver's replay window checks (wire/auth.py)

Payload: DATA/RESULT: ``numel`` int32 values (SPARSE: see wire/sparse.py); a PROBE is
zeros, as long as the answer it asks for (the switch never answers with more bytes than it
received); STATUS: a bitmap of the workers whose contribution the round still waits for
(bit i = rank i); ERROR: a UTF-8 message; CHALLENGE: a nonce that proves a registered
worker address receives (echoed over the TLS control channel before the job goes live).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["HEADER", "HEADER_SIZE", "MAGIC", "VERSION", "DATA", "RESULT", "STATUS", "ERROR",
           "CHALLENGE", "PROBE", "RESEND", "COMPLETE", "SPARSE", "RUN", "ANNOUNCE",
           "SWITCH_RANK", "MAX_DATAGRAM", "NONCE_SIZE", "max_elements", "Header", "Malformed",
           "decode", "decode_header", "check_length", "encode", "TYPE_NAMES"]

HEADER = struct.Struct("<HBBHHHHIIhBBQ")
HEADER_SIZE = HEADER.size  # 32
MAGIC = 0xD1C0
VERSION = 2
DATA, RESULT, STATUS, ERROR, CHALLENGE = 1, 2, 3, 4, 5
TYPE_NAMES = {DATA: "data", RESULT: "result", STATUS: "status", ERROR: "error",
              CHALLENGE: "challenge"}
SWITCH_RANK = 0xFFFF
PROBE, RESEND, COMPLETE, SPARSE, RUN, ANNOUNCE = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
MAX_DATAGRAM = 65507  # largest UDP payload over IPv4


TAG_ROOM = 16  # an authenticated datagram's tag (wire/auth.TAG_SIZE)
NONCE_SIZE = 16  # a CHALLENGE's payload


def max_elements() -> int:
    """The most int32 elements one datagram can carry (with room for a tag)."""
    return (MAX_DATAGRAM - HEADER_SIZE - TAG_ROOM) // 4


class Malformed(ValueError):
    """A datagram that is not a well-formed packet; ``reason`` names the drop counter."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Header:
    type: int
    job: int
    worker: int
    slot: int
    numel: int
    seq: int
    tsi: int
    exp: int
    counter: int = 0
    flags: int = 0

    def pack(self, counter: int | None = None) -> bytes:
        """The 32 header bytes (with ``counter`` in place of the header's own, if given)."""
        return HEADER.pack(MAGIC, VERSION, self.type, self.job, self.worker, self.slot,
                           self.numel, self.seq, self.tsi, self.exp, self.flags, 0,
                           self.counter if counter is None else counter)


def decode_header(data: bytes | bytearray | memoryview) -> Header:
    """Parse a datagram's header. Raises :class:`Malformed` with reason ``truncated``,
    ``foreign``, ``version`` or ``type``."""
    if len(data) < HEADER_SIZE:
        raise Malformed("truncated", f"{len(data)} bytes")
    (magic, version, typ, job, worker, slot, numel, seq, tsi, exp, flags, _resv,
     counter) = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise Malformed("foreign", f"magic {magic:#06x}")
    if version != VERSION:
        raise Malformed("version", f"version {version}")
    if typ not in TYPE_NAMES:
        raise Malformed("type", f"type {typ}")
    return Header(typ, job, worker, slot, numel, seq, tsi, exp, counter, flags)


def check_length(header: Header, payload: bytes | bytearray | memoryview) -> None:
    """A dense DATA or RESULT carries exactly ``numel`` int32 values (a probe: any padding).
    Raises :class:`Malformed` (``length``)."""
    typ, flags = header.type, header.flags
    if typ in (DATA, RESULT) and not flags & (SPARSE | PROBE) and \
            len(payload) != 4 * header.numel:
        raise Malformed("length", f"{len(payload)} payload bytes for {header.numel} elements")


def decode(data: bytes | bytearray | memoryview) -> tuple[Header, memoryview]:
    """Parse an unauthenticated datagram (mode ``none``) into its header and a zero-copy view
    of its payload; raises :class:`Malformed`."""
    header = decode_header(data)
    payload = memoryview(data)[HEADER_SIZE:]
    check_length(header, payload)
    return header, payload


def encode(header: Header, payload: bytes | bytearray | memoryview = b"") -> bytes:
    """The unauthenticated datagram of ``header`` and ``payload``."""
    return header.pack() + bytes(payload)
