"""One end of a job's packet channel: seal what it sends, check what it receives (pure).

A :class:`Channel` holds one side's keys (:class:`~dlcomm.wire.auth.JobKeys`), the counter
of every key it sends with and the replay window of every key it receives with:

- the switch's end (``rank=None``): receives from rank r with ``up[r]``; sends results with
  ``result`` and what goes to one rank alone with ``down[r]``;
- worker r's end: sends with ``up[r]``; receives results with ``result``, the rest with
  ``down[r]``.

:meth:`Channel.seal` turns a header and payload into the datagram's parts (header bytes
with the counter, payload or ciphertext, tag); :meth:`Channel.open` verifies a received
datagram and returns its payload, or raises :class:`Forged` or :class:`Replayed`. In mode
``none`` both only add and strip the header.
"""

from __future__ import annotations

from dlcomm.wire.auth import (
    AUTH_ENCRYPT,
    AUTH_NONE,
    STREAM_DOWN,
    STREAM_RESULT,
    STREAM_UP,
    Forged,
    JobKeys,
    ReplayWindow,
    seal,
    unseal,
)
from dlcomm.wire.packet import HEADER_SIZE, RESULT, SWITCH_RANK, Header

__all__ = ["Channel", "Forged", "Replayed", "Parts"]

Parts = list[bytes | memoryview]


class Replayed(ValueError):
    """An authentic packet seen before (or too old for the replay window)."""


class Channel:
    """Sealing and checking for one end of one job (module docstring)."""

    def __init__(self, keys: JobKeys, rank: int | None) -> None:
        self.keys, self.rank = keys, rank
        self.mode = keys.mode
        self.sent: dict[tuple[int, int], int] = {}          # (stream, rank) -> last counter
        self.windows: dict[tuple[int, int], ReplayWindow] = {}

    @property
    def tag_size(self) -> int:
        return 0 if self.mode == AUTH_NONE else 16

    def _send_key(self, header: Header, to: int | None) -> tuple[int, int]:
        """(stream, rank) of the key a packet is sealed with."""
        if self.rank is not None:
            return STREAM_UP, self.rank
        if header.type == RESULT:
            return STREAM_RESULT, -1
        assert to is not None, "a packet to one rank names it"
        return STREAM_DOWN, to

    def seal(self, header: Header, payload: bytes | memoryview = b"",
             to: int | None = None) -> Parts:
        """The datagram of ``header`` and ``payload`` as parts for ``sendmsg``; ``to``: the
        rank a switch's non-result packet goes to."""
        stream, rank = self._send_key(header, to)
        counter = self.sent.get((stream, rank), -1) + 1
        self.sent[(stream, rank)] = counter
        packed = header.pack(counter)
        if self.mode == AUTH_NONE:
            return [packed, payload]
        keys = self.keys
        key = keys.result if stream == STREAM_RESULT else \
            (keys.up if stream == STREAM_UP else keys.down)[rank]
        assert key is not None
        if self.mode == AUTH_ENCRYPT:
            return [packed, seal(key, self.mode, stream, counter,
                                 packed + bytes(payload), HEADER_SIZE)]
        whole = packed + bytes(payload) if len(payload) else packed
        return [whole, seal(key, self.mode, stream, counter, whole, HEADER_SIZE)]

    def _receive_key(self, header: Header) -> tuple[int, int]:
        if self.rank is None:
            return STREAM_UP, header.worker
        if header.worker != SWITCH_RANK:
            raise Forged("not from the switch")
        return (STREAM_RESULT, -1) if header.type == RESULT else (STREAM_DOWN, self.rank)

    def open(self, header: Header, datagram: memoryview) -> memoryview | bytes:
        """The payload of a received datagram whose header is ``header``; raises
        :class:`Forged` (tag, or a key this end does not hold) or :class:`Replayed`."""
        if self.mode == AUTH_NONE:
            return datagram[HEADER_SIZE:]
        stream, rank = self._receive_key(header)
        keys = self.keys
        key = keys.result if stream == STREAM_RESULT else \
            (keys.up if stream == STREAM_UP else keys.down).get(rank)
        if key is None:
            raise Forged(f"no key for rank {rank}")
        payload = unseal(key, self.mode, stream, header.counter, datagram, HEADER_SIZE)
        window = self.windows.get((stream, rank))
        if window is None:
            window = self.windows[(stream, rank)] = ReplayWindow()
        if not window.accept(header.counter):
            raise Replayed(f"counter {header.counter} seen before")
        return payload
