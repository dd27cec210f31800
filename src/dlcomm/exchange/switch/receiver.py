"""The Python client's receive path: one datagram at a time from the worker's socket and,
where the job's results come to a group of this host, the group's socket.

The native client turns ``UDP_GRO`` on for these sockets and leaves it on, so a run of
same-size datagrams from one sender may wait in a socket's queue as one buffer: a Python
op that reads the socket later gets it with the segment size in a control message, and
:class:`Receiver` cuts it back into datagrams (:func:`gro_segment`). Reads never block and
never set a socket's timeout, so a send on the same socket waits for room in its buffer
(as the native loop polls for it) rather than failing the job when a slow link holds the
buffer full longer than a receive would have waited.
"""

from __future__ import annotations

import math
import select
import socket
from collections import deque

__all__ = ["Receiver", "gro_segment", "UDP_GRO"]

UDP_GRO = getattr(socket, "UDP_GRO", 104)
SOL_UDP = getattr(socket, "SOL_UDP", 17)
CONTROL_BYTES = socket.CMSG_SPACE(4)


def gro_segment(ancdata: list[tuple[int, int, bytes]], n: int) -> int:
    """The size of the datagrams a received buffer of ``n`` bytes holds: the ``UDP_GRO``
    segment size its control message gives, else the buffer is one datagram (pure)."""
    for level, kind, data in ancdata:
        if level == SOL_UDP and kind == UDP_GRO and len(data) >= 4:
            seg = int.from_bytes(data[:4], "little", signed=True)
            if seg > 0:
                return min(seg, n)
    return n


class Receiver:
    """Datagrams from ``sockets``, the first one read first."""

    def __init__(self, *sockets: socket.socket) -> None:
        self.sockets = sockets
        self._poll = select.poll()
        for s in sockets:
            self._poll.register(s, select.POLLIN)
        self._pending: deque[tuple[bytes, tuple[str, int]]] = deque()

    def receive(self, buf: bytearray, timeout: float) -> tuple[int, tuple[str, int]]:
        """One datagram into ``buf``: (its length, its sender). TimeoutError if none came
        within ``timeout`` seconds."""
        if self._pending:
            data, src = self._pending.popleft()
            buf[:len(data)] = data
            return len(data), src
        for waited in (False, True):
            for s in self.sockets:
                try:
                    n, ancdata, _, src = s.recvmsg_into([buf], CONTROL_BYTES,
                                                        socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                seg = gro_segment(ancdata, n)
                if seg >= n:
                    return n, src
                for off in range(seg, n, seg):  # the rest of a GRO batch, in order
                    self._pending.append((bytes(buf[off:min(n, off + seg)]), src))
                return seg, src
            if waited or not self._poll.poll(max(1, math.ceil(timeout * 1000))):
                break
        raise TimeoutError
