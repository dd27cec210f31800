"""A tenant's raw tools against a live switch: a TLS control line and a job of one's own.

- :class:`Line`: a raw TLS control connection (the certificate pinned), speaking JSON lines
  by hand, so that a test or an attack can send what no client would;
- :func:`own_job`: a job the caller registers and attaches itself, every rank from its own
  UDP socket on 127.0.0.1, so it holds the job's keys: its packets reach the dataplane's
  deepest paths (a co-tenant attacking its own job; the fuzz campaign's attacker);
- :func:`drain`: the datagrams that reach a socket.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

from dlcomm.errors import DlcommError
from dlcomm.switch.security import check_pinned, client_context
from dlcomm.wire.auth import AUTH_MODES, JobKeys
from dlcomm.wire.channel import Channel
from dlcomm.wire.packet import CHALLENGE, HEADER_SIZE, Header, decode_header

__all__ = ["Line", "OwnJob", "own_job", "drain"]

Address = tuple[str, int]


class Line:
    """A raw control connection: JSON lines over TLS, the certificate pinned."""

    def __init__(self, address: Address, fp: str, source: str = "127.0.0.1",
                 timeout: float = 5.0) -> None:
        raw = socket.create_connection(address, timeout=timeout, source_address=(source, 0))
        try:
            self.sock = client_context().wrap_socket(raw)
        except BaseException:
            raw.close()
            raise
        try:
            check_pinned(self.sock, fp)
        except BaseException:
            self.sock.close()
            raise
        self.buffer = b""

    def __enter__(self) -> Line:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, obj: dict[str, Any]) -> None:
        self.send_raw(json.dumps(obj).encode() + b"\n")

    def recv(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The next line as an object; None when the switch closed the connection."""
        self.sock.settimeout(timeout)
        while b"\n" not in self.buffer:
            try:
                data = self.sock.recv(1 << 16)
            except (ConnectionError, ssl.SSLError):
                return None
            if not data:
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def ask(self, obj: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        self.send(obj)
        reply = self.recv(timeout)
        if reply is None:
            raise DlcommError(f"the switch closed the connection after {obj.get('op')}")
        return reply


@dataclass
class OwnJob:
    """A job whose every rank the attacker plays: sockets, control lines, keys."""

    job: int
    socks: list[socket.socket]
    lines: list[Line]
    channels: list[Channel]
    reply: dict[str, Any] = field(default_factory=dict)
    secrets: list[bytes] = field(default_factory=list)

    @property
    def addresses(self) -> list[Address]:
        return [s.getsockname() for s in self.socks]

    def send(self, rank: int, header: Header, payload: bytes, to: Address) -> bytes:
        datagram = b"".join(bytes(p) for p in self.channels[rank].seal(header, payload))
        self.socks[rank].sendto(datagram, to)
        return datagram

    def close(self) -> None:
        for line in self.lines:
            line.close()
        for sock in self.socks:
            sock.close()


def _ok(reply: dict[str, Any]) -> None:
    if not reply.get("ok"):
        raise DlcommError(f"the switch refused: {reply.get('error', reply)}")


def _challenge(line: Line, sock: socket.socket, job: int, rank: int, ticket: str) -> bytes:
    _ok(line.ask({"op": "challenge", "job": job, "rank": rank, "ticket": ticket}))
    sock.settimeout(5)
    while True:
        data = sock.recv(1 << 16)
        hdr = decode_header(data)
        if hdr.type == CHALLENGE and hdr.job == job:
            return data[HEADER_SIZE:]


def own_job(address: Address, fp: str, workers: int = 2, k: int = 16, slots: int = 2,
            block: int = 0, auth: str = "authenticated", token: str | None = None,
            host: str = "127.0.0.1") -> OwnJob:
    """Register, challenge and attach every rank of a new job from ``host`` (a loopback
    address: 127.0.0.0/8 gives an attacker many sources)."""
    own = OwnJob(-1, [], [], [])
    try:
        for _ in range(workers):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            own.socks.append(sock)
            sock.bind((host, 0))
        own.lines.extend(Line(address, fp, source=host) for _ in range(workers))
        _attach_all(own, {"op": "register", "addresses": [list(s.getsockname())
                                                          for s in own.socks],
                          "slots": slots, "k": k, "block": block, "auth": auth,
                          "token": token}, auth)
    except BaseException:
        own.close()
        raise
    return own


def _attach_all(own: OwnJob, register: dict[str, Any], auth: str) -> None:
    own.reply = reply = own.lines[0].ask(register)
    _ok(reply)
    own.job, tickets = reply["job"], reply["tickets"]
    for rank, (line, sock) in enumerate(zip(own.lines, own.socks)):
        nonce = _challenge(line, sock, own.job, rank, tickets[rank])
        attached = line.ask({"op": "attach", "job": own.job, "rank": rank,
                             "ticket": tickets[rank], "nonce": nonce.hex()})
        _ok(attached)
        own.secrets.append(bytes.fromhex(attached["secret"]))
        own.channels.append(Channel(JobKeys.derive(own.secrets[-1], own.job,
                                                   AUTH_MODES[auth], [rank]), rank))
    for line in own.lines[:-1]:  # the last one to attach was told; the others hear it
        event = line.recv() or {}
        if event.get("event") != "job_live":
            raise DlcommError(f"expected job_live, got {event}")


def drain(sock: socket.socket, wait: float = 0.3) -> list[bytes]:
    """Every datagram that reaches ``sock`` within ``wait`` seconds of the last one."""
    out = []
    sock.settimeout(wait)
    with contextlib.suppress(TimeoutError):
        while True:
            out.append(sock.recv(1 << 16))
    return out
