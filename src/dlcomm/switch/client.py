"""The client side of the switch's control channel (see :mod:`dlcomm.wire.control`).

A job's workers register and attach through :class:`ControlClient` (its connection then
carries failure events for as long as the job lives); ``dlcomm switch stats`` and tests ask
single questions with :func:`request_once`. Addresses are written ``HOST:PORT[+HOST:PORT]``
(:func:`parse_addresses`).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
from typing import Any

from dlcomm.errors import ConfigError, ExchangeError
from dlcomm.wire.control import decode_line, encode_line

__all__ = ["ControlClient", "request_once", "parse_addresses", "Address"]

Address = tuple[str, int]


def parse_addresses(text: str, any_port: bool = False) -> list[Address]:
    """``a:p+b:q`` (or ``a:p,b:q``) -> [(a, p), (b, q)]; port 0 only with ``any_port``
    (an address to bind: the kernel picks a free port)."""
    out = []
    for part in filter(None, (p.strip() for p in text.replace(",", "+").split("+"))):
        host, _, port = part.rpartition(":")
        try:
            out.append((host, int(port)))
        except ValueError:
            raise ConfigError(f"bad switch address {part!r} (expected HOST:PORT)") from None
        if not host or not (0 if any_port else 1) <= out[-1][1] < 65536:
            raise ConfigError(f"bad switch address {part!r} (expected HOST:PORT)")
    if not out:
        raise ConfigError("the switch exchange needs addr=HOST:PORT (or --switch)")
    return out


def _connect(address: Address, timeout: float) -> socket.socket:
    try:
        return socket.create_connection(address, timeout=timeout)
    except OSError as exc:
        raise ExchangeError(f"cannot reach the switch at {address[0]}:{address[1]}: "
                            f"{exc.strerror or exc} (is `dlcomm switch serve` running?)") from exc


def request_once(address: Address, req: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Send one request on a fresh connection and return the reply (e.g. stats, ping)."""
    with _connect(address, timeout) as conn, conn.makefile("rb") as lines:
        conn.sendall(encode_line(req))
        line = lines.readline()
    if not line:
        raise ExchangeError(f"the switch at {address[0]}:{address[1]} closed the connection")
    reply = decode_line(line)
    if not reply.get("ok"):
        raise ExchangeError(f"switch {address[0]}:{address[1]}: {reply.get('error')}")
    return reply


class ControlClient:
    """A long-lived control connection: job registration/attachment, then failure events."""

    def __init__(self, address: Address, timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = timeout
        self.conn = _connect(address, timeout)
        self.conn.settimeout(None)  # the reader waits for events as long as the job lives
        self._lines = self.conn.makefile("rb")
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.failure: str | None = None
        self._closing = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        where = f"{self.address[0]}:{self.address[1]}"
        try:
            for line in self._lines:
                msg = decode_line(line)
                event = msg.get("event")
                if event == "worker_left":
                    self.failure = (f"worker rank {msg['rank']} left the job without finishing "
                                    f"(the switch at {where} saw its connection close)")
                elif event == "job_timeout":
                    self.failure = f"the switch at {where} ended the job after it went idle"
                else:
                    self._replies.put(msg)
        except (OSError, ValueError):
            pass
        if not self._closing and self.failure is None:
            self.failure = (f"lost the control connection to the switch at {where} "
                            "(did it stop or restart?)")
        self._replies.put(None)

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            self.conn.sendall(encode_line(req))
            reply = self._replies.get(timeout=self.timeout)
        except (OSError, queue.Empty) as exc:
            raise ExchangeError(f"switch {self.address[0]}:{self.address[1]} did not answer "
                                f"{req.get('op')!r}: {exc}") from exc
        if reply is None:
            raise ExchangeError(self.failure or "control connection closed")
        if not reply.get("ok"):
            raise ExchangeError(f"switch {self.address[0]}:{self.address[1]}: {reply.get('error')}")
        return reply

    def close(self, leave: bool = True) -> None:
        if leave and self.failure is None:
            with contextlib.suppress(ExchangeError):
                self.request({"op": "leave"})
        self._closing = True
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.conn.close()
