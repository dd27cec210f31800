"""The client side of the switch's control channel (see :mod:`dlcomm.wire.control`).

Every connection is TLS 1.3 to a switch whose certificate fingerprint the client was given
(pinned: no other certificate is accepted). A job's workers register and attach through
:class:`ControlClient`, whose connection then carries failure events for as long as the
job lives and a heartbeat every few seconds (with TCP keepalive underneath, so that a
vanished host is noticed on both ends); ``dlcomm switch stats`` and tests ask single
questions with :func:`request_once`. Addresses are written ``HOST:PORT[+HOST:PORT]``
(:func:`parse_addresses`).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import select
import socket
import ssl
import threading
import time
from typing import Any

from dlcomm.errors import ConfigError, ExchangeError
from dlcomm.sockets import keepalive
from dlcomm.switch.security import check_pinned, client_context
from dlcomm.wire.control import decode_line, encode_line

__all__ = ["ControlClient", "request_once", "parse_addresses", "Address", "HEARTBEAT_S"]

Address = tuple[str, int]
HEARTBEAT_S = 10.0


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


def _connect(address: Address, fingerprint: str, timeout: float) -> ssl.SSLSocket:
    where = f"{address[0]}:{address[1]}"
    try:
        raw = socket.create_connection(address, timeout=timeout)
    except OSError as exc:
        raise ExchangeError(f"cannot reach the switch at {where}: {exc.strerror or exc} "
                            "(is `dlcomm switch serve` running?)") from exc
    try:
        keepalive(raw)
        conn = client_context().wrap_socket(raw)
        check_pinned(conn, fingerprint)
        return conn
    except (OSError, ssl.SSLError) as exc:
        raw.close()
        raise ExchangeError(f"no trusted TLS connection to the switch at {where}: "
                            f"{str(exc)[:200]}") from exc


def request_once(address: Address, fingerprint: str, req: dict[str, Any],
                 timeout: float = 5.0) -> dict[str, Any]:
    """Send one request on a fresh connection and return the reply (e.g. stats, ping)."""
    with _connect(address, fingerprint, timeout) as conn, conn.makefile("rb") as lines:
        conn.sendall(encode_line(req))
        line = lines.readline()
    if not line:
        raise ExchangeError(f"the switch at {address[0]}:{address[1]} closed the connection")
    reply = decode_line(line)
    if not reply.get("ok"):
        raise ExchangeError(f"switch {address[0]}:{address[1]}: {reply.get('error')}")
    return reply


class ControlClient:
    """A long-lived control connection: registration or attachment, then events.

    One thread owns the TLS socket (an SSL connection is not to be read and written from two
    threads at once): it reads replies and events, writes the requests other threads queue,
    and sends a heartbeat every :data:`HEARTBEAT_S` once :meth:`start_heartbeats` was called.
    """

    def __init__(self, address: Address, fingerprint: str, timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = timeout
        self.conn = _connect(address, fingerprint, timeout)
        self.conn.setblocking(False)
        self._ids = itertools.count(1)
        self._outbox: queue.Queue[bytes] = queue.Queue()
        self._pending: dict[int, queue.Queue[dict[str, Any] | None]] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self.failure: str | None = None
        self.live = threading.Event()   # the job went live (every rank attached)
        self._closing = False
        self._heartbeat_s: float | None = None
        self._done = threading.Event()
        self._io = threading.Thread(target=self._run, daemon=True, name="dlcomm-switch-control")
        self._io.start()

    # -- the I/O thread --------------------------------------------------------------------
    def _run(self) -> None:
        where = f"{self.address[0]}:{self.address[1]}"
        buffer = b""
        next_beat = float("inf")
        try:
            while not self._closing:
                now = time.monotonic()
                if self._heartbeat_s is not None and next_beat == float("inf"):
                    next_beat = now + self._heartbeat_s
                if now >= next_beat:
                    assert self._heartbeat_s is not None
                    self._outbox.put(encode_line({"op": "heartbeat", "id": 0}))
                    next_beat = now + self._heartbeat_s
                wait = None if next_beat == float("inf") else max(0.0, next_beat - now)
                if not self.conn.pending():
                    ready, _, _ = select.select([self.conn, self._wake_r], [], [], wait)
                else:
                    ready = [self.conn]
                if self._wake_r in ready:
                    self._wake_r.recv(4096)
                while not self._outbox.empty():
                    self._write(self._outbox.get())
                if self.conn in ready:
                    try:
                        data = self.conn.recv(1 << 16)
                    except ssl.SSLWantReadError:
                        continue
                    if not data:
                        break
                    buffer += data
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        self._dispatch(decode_line(line), where)
        except (OSError, ValueError, ssl.SSLError):
            pass
        if not self._closing and self.failure is None:
            self.failure = (f"lost the control connection to the switch at {where} "
                            "(did it stop or restart?)")
        for box in list(self._pending.values()):
            box.put(None)
        self._done.set()

    def _write(self, line: bytes) -> None:
        view = memoryview(line)
        while view:
            try:
                sent = self.conn.send(view)
                view = view[sent:]
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                select.select([], [self.conn], [], 1.0)

    def _dispatch(self, msg: dict[str, Any], where: str) -> None:
        event = msg.get("event")
        if event is None:
            box = self._pending.pop(int(msg.get("id", 0) or 0), None)
            if box is not None:
                box.put(msg)
        elif event == "job_live":
            self.live.set()
        elif event == "worker_left":
            self.failure = (f"worker rank {msg.get('rank')} left the job without finishing "
                            f"(the switch at {where} saw its connection close)")
            waiting = msg.get("waiting")
            if isinstance(waiting, dict) and isinstance(waiting.get("ranks"), list):
                ranks = ", ".join(str(r) for r in waiting["ranks"])
                self.failure += (f"; the job was still waiting for rank(s) {ranks} "
                                 f"since {waiting.get('since_s')} s")
        elif event == "job_failed":
            self.failure = f"the switch at {where} failed the job: {msg.get('reason')}"
        elif event == "job_timeout":
            self.failure = f"the switch at {where} ended the job after it went idle"

    # -- what other threads call -------------------------------------------------------------
    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send ``req`` and wait for its reply (events meanwhile are handled)."""
        ident = next(self._ids)
        box: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._pending[ident] = box
        self._outbox.put(encode_line({**req, "id": ident}))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        try:
            reply = box.get(timeout=self.timeout)
        except queue.Empty as exc:
            self._pending.pop(ident, None)
            raise ExchangeError(f"switch {self.address[0]}:{self.address[1]} did not answer "
                                f"{req.get('op')!r} within {self.timeout:g} s") from exc
        if reply is None:
            raise ExchangeError(self.failure or "control connection closed")
        if not reply.get("ok"):
            raise ExchangeError(f"switch {self.address[0]}:{self.address[1]}: "
                                f"{reply.get('error')}")
        return reply

    def start_heartbeats(self, every_s: float = HEARTBEAT_S) -> None:
        """Tell the switch every ``every_s`` that this rank is alive (keeps an idle job)."""
        self._heartbeat_s = every_s
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self, leave: bool = True) -> None:
        if leave and self.failure is None and not self._done.is_set():
            with contextlib.suppress(ExchangeError):
                self.request({"op": "leave"})
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._io.join(timeout=5)
        for sock in (self.conn, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()
