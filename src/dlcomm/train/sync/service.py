"""Prague's Group Generator as a small TCP service (a thread of rank 0), and its client.

The protocol is one JSON object per line (UTF-8, ``\\n``-terminated):

- worker -> GG: ``{"op": "hello", "rank": R, "token": T}`` once, then
  ``{"op": "ready", "rank": R, "steps": K, "final": bool}`` after each local step;
- GG -> worker: ``{"group": [ranks], "seq": S, "round": r}`` or ``{"stop": true}``;
- GG -> a refused connection: ``{"error": "why"}``, then the GG closes that connection.

**Token.** Rank 0 makes a random job token (:func:`~.group_protocol.new_token`,
``secrets.token_hex(16)``) and broadcasts it with the service's address through
torch.distributed (the job's own rendezvous); a ``hello`` must carry it (compared with
``hmac.compare_digest``). A rank says hello once: a second hello for a rank that is
connected is refused, and the first connection keeps the rank. A ``ready`` is always for
the rank its connection said hello as (a ``rank`` field in it must agree); a connection
that has not said hello may only say hello.

**Refusals** (one error line, then that connection is closed; the service and the other
workers go on): a line that is not a JSON object, has missing or ill-typed fields (ranks
are ints in 0..n-1, not bools; steps ints >= 0; ``final`` a bool), uses NaN or Infinity,
or nests too deeply; a line longer than 64 KiB (``MAX_LINE_BYTES``), also while no newline
has come yet; a connection that says no hello within 10 s (``HELLO_TIMEOUT_S``); a
connection beyond the cap of ``4 * n + 16`` (:func:`~.group_protocol.connection_cap`).
A worker that does not read its answers for 5 s (``SEND_TIMEOUT_S``) is dropped without
one. The limits live in :mod:`.group_protocol` (:class:`~.group_protocol.ServiceLimits`).
Only a failure of the generator itself stops the service (``error`` says why; the
workers see their connections drop).

The service feeds requests to a pure :class:`~.prague.GroupGenerator` and sends the
deliveries it returns; it calls ``tick`` at the generator's deadlines (the ``buffer``
generator's window). A worker's wait for its answer has the run's deadline.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from dlcomm.errors import ExchangeError, ExchangeTimeout
from dlcomm.train.sync.group_protocol import (
    Hello,
    ProtocolError,
    Ready,
    ServiceLimits,
    check_message,
    connection_cap,
    error_line,
    new_token,
    parse_line,
    reply_line,
    show,
    token_matches,
)
from dlcomm.train.sync.prague import Delivery, Group, GroupGenerator

__all__ = ["GroupService", "GroupClient", "ServiceLimits", "new_token", "reachable_address"]


def reachable_address(peer_host: str, peer_port: int) -> str:
    """The address of this host on the route to ``peer_host`` (loopback stays loopback)."""
    if peer_host.startswith("127.") or peer_host == "localhost":
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer_host, peer_port or 9))
        return str(probe.getsockname()[0])


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    opened: float
    buffer: bytes = b""
    rank: int | None = None              # set by its hello
    closing_since: float | None = None   # refused: draining until EOF or the linger ends


class GroupService:
    """Serves ``generator`` to the workers that know ``token`` until closed."""

    def __init__(self, generator: GroupGenerator, host: str, token: str,
                 limits: ServiceLimits | None = None) -> None:
        if not token:
            raise ValueError("the group service needs a job token")
        self.generator = generator
        self.token = token
        self.limits = limits or ServiceLimits()
        self.max_connections = self.limits.max_connections or connection_cap(generator.n)
        self.listener = socket.create_server((host, 0))
        self.listener.setblocking(False)
        self.address = (host, int(self.listener.getsockname()[1]))
        self._wake_r, self._wake_w = socket.socketpair()
        self._closing = False
        self.error: str | None = None
        self._sel = selectors.DefaultSelector()
        self._conns: dict[socket.socket, _Conn] = {}
        self._clients: dict[int, _Conn] = {}
        self._thread = threading.Thread(target=self._run, daemon=True, name="dlcomm-prague-gg")
        self._thread.start()

    def _run(self) -> None:
        self._sel.register(self.listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._closing:
                deadline = self.generator.next_deadline()
                for key, _ in self._sel.select(self._wait_s(deadline, time.monotonic())):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    elif key.data.sock in self._conns:  # not dropped earlier in this batch
                        self._on_readable(key.data)
                now = time.monotonic()
                self._expire(now)
                if deadline is not None and now >= deadline:
                    self._send(self.generator.tick(now))
        except Exception as exc:  # reported by close(); workers see their connection drop
            self.error = f"prague group generator failed: {type(exc).__name__}: {exc}"
        finally:
            for conn in self._conns.values():
                conn.sock.close()
            self._sel.close()

    def _wait_s(self, deadline: float | None, now: float) -> float:
        """Until the next generator deadline, hello timeout or linger end (at most 1 s)."""
        times = [now + 1.0] if deadline is None else [min(now + 1.0, deadline)]
        for c in self._conns.values():
            if c.closing_since is not None:
                times.append(c.closing_since + self.limits.linger_s)
            elif c.rank is None:
                times.append(c.opened + self.limits.hello_timeout_s)
        return max(0.0, min(times) - now)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:  # gone again, or out of descriptors: try at the next event
            return
        if len(self._conns) >= self.max_connections:
            sock.setblocking(False)
            try:
                sock.send(error_line(f"too many connections (at most {self.max_connections})"))
            except OSError:
                pass
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer_bytes)
        sock.settimeout(self.limits.send_timeout_s)   # bounds sendall to a worker
        conn = _Conn(sock, time.monotonic())
        self._conns[sock] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            self._drop(conn)
        elif conn.closing_since is None:   # a refused connection's input is discarded
            conn.buffer += data
            self._take_lines(conn)

    def _take_lines(self, conn: _Conn) -> None:
        *lines, conn.buffer = conn.buffer.split(b"\n")
        limit = self.limits.max_line_bytes
        for line in lines:
            if len(line) > limit:
                self._refuse(conn, f"a line is at most {limit} bytes")
            else:
                self._on_line(conn, line)
            if conn.closing_since is not None or conn.sock not in self._conns:
                return
        if len(conn.buffer) > limit:
            self._refuse(conn, f"a line is at most {limit} bytes")

    def _on_line(self, conn: _Conn, line: bytes) -> None:
        request = self._check(conn, line)
        if request is not None:
            assert conn.rank is not None  # _check lets a ready through only after hello
            # outside the boundary: the generator's own failure stops the service
            self._send(self.generator.ready(conn.rank, time.monotonic(), request.steps,
                                            request.final))

    def _check(self, conn: _Conn, line: bytes) -> Ready | None:
        """The ready request in ``line``; None: it was a hello, or it was refused."""
        try:
            request = check_message(parse_line(line), self.generator.n, conn.rank)
            if isinstance(request, Hello):
                self._hello(conn, request)
                return None
            return request
        except ProtocolError as exc:
            self._refuse(conn, str(exc))
            return None

    def _hello(self, conn: _Conn, hello: Hello) -> None:
        if not token_matches(hello.token, self.token):
            raise ProtocolError("wrong job token")
        if hello.rank in self._clients:
            raise ProtocolError(f"rank {hello.rank} is already connected")
        conn.rank = hello.rank
        self._clients[hello.rank] = conn

    def _send(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            conn = self._clients.get(d.rank)
            if conn is None:
                continue  # that worker has gone; its peers find out by their deadlines
            try:
                conn.sock.sendall(reply_line(d))
            except OSError:  # TimeoutError included: it has not read for send_timeout_s
                self._drop(conn)

    def _release(self, conn: _Conn) -> None:
        if conn.rank is not None and self._clients.get(conn.rank) is conn:
            del self._clients[conn.rank]

    def _refuse(self, conn: _Conn, reason: str) -> None:
        """One error line, then close: now for writing, after the linger for reading."""
        self._release(conn)
        conn.closing_since = time.monotonic()
        conn.buffer = b""
        try:
            conn.sock.setblocking(False)
            conn.sock.send(error_line(reason))
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._release(conn)
        if self._conns.pop(conn.sock, None) is not None:
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _expire(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if conn.closing_since is not None:
                if now - conn.closing_since >= self.limits.linger_s:
                    self._drop(conn)
            elif conn.rank is None and now - conn.opened >= self.limits.hello_timeout_s:
                self._refuse(conn, f"no hello within {self.limits.hello_timeout_s:g} s")

    def close(self) -> None:
        self._closing = True
        self._wake_w.send(b"x")
        self._thread.join(self.limits.send_timeout_s + 5.0)
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()


class GroupClient:
    """A worker's connection to the Group Generator (``token``: the job's, from rank 0)."""

    def __init__(self, address: tuple[str, int], rank: int, timeout_s: float,
                 token: str) -> None:
        self.rank = rank
        self.timeout_s = timeout_s
        try:
            self.sock = socket.create_connection(address, timeout=timeout_s)
        except OSError as exc:
            raise ExchangeError(f"prague: rank {rank} cannot reach the group generator at "
                                f"{address[0]}:{address[1]}: {exc.strerror or exc}") from exc
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""
        self._send({"op": "hello", "rank": rank, "token": token})

    def _lost(self, detail: str) -> ExchangeError:
        return ExchangeError(f"prague: rank {self.rank} lost the group generator "
                             f"(rank 0): {detail}")

    def _send(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError as exc:
            refusal = self._refusal_received()
            if refusal is not None:
                raise refusal from exc
            raise self._lost(exc.strerror or str(exc)) from exc

    def _refusal_received(self) -> ExchangeError | None:
        """The service's error line if it already arrived (it refused, then closed)."""
        try:
            self.sock.settimeout(0.2)
            while b"\n" not in self._buffer:
                data = self.sock.recv(65536)
                if not data:
                    break
                self._buffer += data
        except OSError:
            pass
        finally:
            self.sock.settimeout(self.timeout_s)
        if b"\n" not in self._buffer:
            return None
        try:
            reply = json.loads(self._buffer.split(b"\n", 1)[0])
        except ValueError:
            return None
        return self._refused(reply) if isinstance(reply, dict) and "error" in reply else None

    def _refused(self, reply: dict[str, Any]) -> ExchangeError:
        return ExchangeError(f"prague: the group generator refused rank {self.rank}: "
                             f"{reply['error']}")

    def _read_line(self) -> bytes:
        while b"\n" not in self._buffer:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise ExchangeTimeout(f"prague: rank {self.rank} waited {self.timeout_s:g} s "
                                      "for a group from the group generator") from None
            except OSError as exc:
                raise self._lost(exc.strerror or str(exc)) from exc
            if not data:
                raise self._lost("rank 0 closed the connection")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def ask(self, steps: int, final: bool) -> Group | None:
        """This worker's next group, or None: the run has ended."""
        self._send({"op": "ready", "rank": self.rank, "steps": steps, "final": final})
        line = self._read_line()
        try:
            reply = json.loads(line)
            if "error" in reply:
                raise self._refused(reply)
            if reply.get("stop"):
                return None
            return Group(int(reply["seq"]), tuple(reply["group"]), int(reply["round"]))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ExchangeError(f"prague: rank {self.rank} got a malformed answer from the "
                                f"group generator: {show(line)}") from exc

    def close(self) -> None:
        self.sock.close()
