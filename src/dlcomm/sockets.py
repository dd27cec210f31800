"""Small socket helpers shared by the switch service and its clients."""

from __future__ import annotations

import errno
import socket

__all__ = ["set_buffers", "BUFFER_BYTES", "keepalive", "OUT_OF_RESOURCES"]

# an accept that fails for want of these succeeds later: a server waits, then accepts again
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

SO_RCVBUFFORCE, SO_SNDBUFFORCE = 33, 32  # Linux
BUFFER_BYTES = 64 << 20


def set_buffers(sock: socket.socket, size: int = BUFFER_BYTES) -> None:
    """Large socket buffers, so bursts of a whole window do not overflow them.

    As root (CAP_NET_ADMIN) the FORCE variants ignore net.core.rmem_max/wmem_max;
    otherwise the kernel caps the request at those limits.
    """
    for force, plain in ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, size)


def keepalive(sock: socket.socket) -> None:
    """TCP keepalive: a peer that vanished is noticed within about a minute."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
