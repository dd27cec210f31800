"""Live switches on loopback for the attack tests, and an attacker's tools.

- :func:`live_switch`: a :class:`~dlcomm.switch.server.SwitchServer` in a thread of the test
  process (its state can be inspected), with the limits, token and timeouts a test needs;
- :class:`Line`: a raw TLS control connection (pinned), speaking JSON lines by hand, so that
  a test can send what no client would;
- :func:`own_job`: a job the attacker registers and attaches itself (its own UDP sockets on
  127.0.0.1, so it holds the keys: its packets reach the dataplane's deep paths).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dlcomm.switch.registrations import Limits
from dlcomm.switch.security import check_pinned, client_context, identity
from dlcomm.switch.server import SwitchServer
from dlcomm.wire.auth import AUTH_MODES, JobKeys
from dlcomm.wire.channel import Channel
from dlcomm.wire.packet import CHALLENGE, HEADER_SIZE, Header, decode_header

Address = tuple[str, int]


@dataclass
class Live:
    server: SwitchServer
    address: Address
    fp: str
    thread: threading.Thread

    def stats(self, token: str | None = None) -> dict[str, Any]:
        with Line(self.address, self.fp) as line:
            reply = line.ask({"op": "stats", "token": token})
        assert reply["ok"], reply
        return reply["stats"]

    def counter(self, name: str) -> int:
        return int(self.server.stats()["counters"].get(name, 0))


@contextlib.contextmanager
def live_switch(token: str | None = None, limits: Limits = Limits(), job_timeout_s: float = 600.0,
                slots: int = 64) -> Iterator[Live]:
    server = SwitchServer("127.0.0.1", 0, identity("127.0.0.1"), slots=slots,
                          job_timeout_s=job_timeout_s, token=token, limits=limits)
    thread = threading.Thread(target=server.run, daemon=True, name="test-switch")
    thread.start()
    deadline = time.monotonic() + 10
    while server._loop is None and time.monotonic() < deadline:  # the control plane is up
        time.sleep(0.01)
    try:
        yield Live(server, server.address, server.identity.fingerprint, thread)
    finally:
        server.stop()
        thread.join(10)
        assert not thread.is_alive(), "the switch did not stop"


class Line:
    """A raw control connection: JSON lines over TLS, the certificate pinned."""

    def __init__(self, address: Address, fp: str, source: str = "127.0.0.1",
                 timeout: float = 5.0) -> None:
        raw = socket.create_connection(address, timeout=timeout, source_address=(source, 0))
        self.sock = client_context().wrap_socket(raw)
        check_pinned(self.sock, fp)
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
        assert reply is not None, f"the switch closed the connection after {obj.get('op')}"
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


def _challenge(line: Line, sock: socket.socket, job: int, rank: int, ticket: str) -> bytes:
    reply = line.ask({"op": "challenge", "job": job, "rank": rank, "ticket": ticket})
    assert reply["ok"], reply
    sock.settimeout(5)
    while True:
        data = sock.recv(1 << 16)
        hdr = decode_header(data)
        if hdr.type == CHALLENGE and hdr.job == job:
            return data[HEADER_SIZE:]


def own_job(address: Address, fp: str, workers: int = 2, k: int = 16, slots: int = 2,
            block: int = 0, auth: str = "authenticated", token: str | None = None) -> OwnJob:
    """Register, challenge and attach every rank of a new job on loopback."""
    socks = []
    for _ in range(workers):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
    lines = [Line(address, fp) for _ in range(workers)]
    reply = lines[0].ask({"op": "register", "addresses": [list(s.getsockname()) for s in socks],
                          "slots": slots, "k": k, "block": block, "auth": auth,
                          "token": token})
    assert reply["ok"], reply
    job, tickets = reply["job"], reply["tickets"]
    channels, secrets = [], []
    for rank, (line, sock) in enumerate(zip(lines, socks)):
        nonce = _challenge(line, sock, job, rank, tickets[rank])
        attached = line.ask({"op": "attach", "job": job, "rank": rank,
                             "ticket": tickets[rank], "nonce": nonce.hex()})
        assert attached["ok"], attached
        secrets.append(bytes.fromhex(attached["secret"]))
        channels.append(Channel(JobKeys.derive(secrets[-1], job, AUTH_MODES[auth], [rank]),
                                rank))
    for line in lines[:-1]:  # the last one to attach was told; the others hear it
        assert (line.recv() or {}).get("event") == "job_live"
    return OwnJob(job, socks, lines, channels, reply, secrets)


def drain(sock: socket.socket, wait: float = 0.3) -> list[bytes]:
    """Every datagram that reaches ``sock`` within ``wait`` seconds of the last one."""
    out = []
    sock.settimeout(wait)
    with contextlib.suppress(TimeoutError):
        while True:
            out.append(sock.recv(1 << 16))
    return out
