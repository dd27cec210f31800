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

import numpy as np

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

__all__ = ["Channel", "Forged", "Replayed", "Parts", "Framed", "frame_buffer"]

Parts = list[bytes | memoryview]


def frame_buffer(elements: int) -> tuple[bytearray, np.ndarray]:
    """A frame for ``elements`` int32 values and the int32 array that lives in it (after
    the header's room)."""
    frame = bytearray(HEADER_SIZE + 4 * elements)
    return frame, np.frombuffer(frame, dtype=np.int32, offset=HEADER_SIZE)


class Framed:
    """A payload in ``frame[HEADER_SIZE : HEADER_SIZE + size]`` of a writable buffer whose
    first HEADER_SIZE bytes are free for the header: :meth:`Channel.seal` writes the header
    there and tags the frame as it is, without copying the payload."""

    __slots__ = ("frame", "size")

    def __init__(self, frame: memoryview, size: int) -> None:
        self.frame, self.size = frame, size

    def __len__(self) -> int:
        return self.size


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

    def seal(self, header: Header, payload: bytes | memoryview | Framed = b"",
             to: int | None = None) -> Parts:
        """The datagram of ``header`` and ``payload`` as parts for ``sendmsg``; ``to``: the
        rank a switch's non-result packet goes to. A :class:`Framed` payload is sealed in
        place (its header written into the frame's room: no copy)."""
        stream, rank = self._send_key(header, to)
        counter = self.sent.get((stream, rank), -1) + 1
        self.sent[(stream, rank)] = counter
        packed = header.pack(counter)
        whole: bytes | memoryview
        if isinstance(payload, Framed):
            framed = True
            whole = payload.frame[: HEADER_SIZE + payload.size]
            whole[:HEADER_SIZE] = packed
            body: bytes | memoryview = whole[HEADER_SIZE:]
        else:
            framed, body = False, payload
        if self.mode == AUTH_NONE:
            return [whole] if framed else [packed, body]
        keys = self.keys
        key = keys.result if stream == STREAM_RESULT else \
            (keys.up if stream == STREAM_UP else keys.down)[rank]
        assert key is not None
        if not framed:
            whole = b"".join((packed, body)) if len(body) else packed  # one copy
        tag_or_cipher = seal(key, self.mode, stream, counter, whole, HEADER_SIZE)
        return [packed if self.mode == AUTH_ENCRYPT else whole, tag_or_cipher]

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
