"""Prague's Group Generator as a small TCP service (a thread of rank 0), and its client.

The protocol is one JSON object per line:

- worker -> GG: ``{"op": "hello", "rank": R}`` once, then
  ``{"op": "ready", "rank": R, "steps": K, "final": bool}`` after each local step;
- GG -> worker: ``{"group": [ranks], "seq": S, "round": r}`` or ``{"stop": true}``.

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
from typing import Any, cast

from dlcomm.errors import ExchangeError, ExchangeTimeout
from dlcomm.train.sync.prague import Delivery, Group, GroupGenerator

__all__ = ["GroupService", "GroupClient", "reachable_address"]


def reachable_address(peer_host: str, peer_port: int) -> str:
    """The address of this host on the route to ``peer_host`` (loopback stays loopback)."""
    if peer_host.startswith("127.") or peer_host == "localhost":
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer_host, peer_port or 9))
        return str(probe.getsockname()[0])


class GroupService:
    """Serves ``generator`` to the workers until closed."""

    def __init__(self, generator: GroupGenerator, host: str) -> None:
        self.generator = generator
        self.listener = socket.create_server((host, 0))
        self.address = (host, int(self.listener.getsockname()[1]))
        self._wake_r, self._wake_w = socket.socketpair()
        self._closing = False
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="dlcomm-prague-gg")
        self._thread.start()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        buffers: dict[socket.socket, bytes] = {}
        clients: dict[int, socket.socket] = {}
        try:
            while not self._closing:
                deadline = self.generator.next_deadline()
                timeout = 1.0 if deadline is None else \
                    min(1.0, max(0.0, deadline - time.monotonic()))
                for key, _ in sel.select(timeout):
                    if key.data == "listen":
                        conn, _ = self.listener.accept()
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        sel.register(conn, selectors.EVENT_READ, "client")
                        buffers[conn] = b""
                    elif key.data == "wake":
                        self._wake_r.recv(64)
                    else:
                        conn = cast(socket.socket, key.fileobj)  # registered as sockets
                        data = conn.recv(65536)
                        if not data:
                            sel.unregister(conn)
                            conn.close()
                            buffers.pop(conn, None)
                            continue
                        buffers[conn] += data
                        while b"\n" in buffers[conn]:
                            line, buffers[conn] = buffers[conn].split(b"\n", 1)
                            self._handle(json.loads(line), conn, clients)
                if deadline is not None and time.monotonic() >= deadline:
                    self._send(self.generator.tick(time.monotonic()), clients)
        except Exception as exc:  # reported by close(); workers see their connection drop
            self.error = f"prague group generator failed: {type(exc).__name__}: {exc}"
        finally:
            for conn in buffers:
                conn.close()
            sel.close()

    def _handle(self, msg: dict[str, Any], conn: socket.socket,
                clients: dict[int, socket.socket]) -> None:
        if msg["op"] == "hello":
            clients[int(msg["rank"])] = conn
            return
        out = self.generator.ready(int(msg["rank"]), time.monotonic(), int(msg["steps"]),
                                   bool(msg["final"]))
        self._send(out, clients)

    @staticmethod
    def _send(deliveries: list[Delivery], clients: dict[int, socket.socket]) -> None:
        for d in deliveries:
            if d.group is None:
                reply: dict[str, Any] = {"stop": True}
            else:
                reply = {"group": list(d.group.members), "seq": d.group.seq,
                         "round": d.group.round}
            clients[d.rank].sendall(json.dumps(reply).encode() + b"\n")

    def close(self) -> None:
        self._closing = True
        self._wake_w.send(b"x")
        self._thread.join(5.0)
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()


class GroupClient:
    """A worker's connection to the Group Generator."""

    def __init__(self, address: tuple[str, int], rank: int, timeout_s: float) -> None:
        self.rank = rank
        self.timeout_s = timeout_s
        try:
            self.sock = socket.create_connection(address, timeout=timeout_s)
        except OSError as exc:
            raise ExchangeError(f"prague: rank {rank} cannot reach the group generator at "
                                f"{address[0]}:{address[1]}: {exc.strerror or exc}") from exc
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""
        self._send({"op": "hello", "rank": rank})

    def _send(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError as exc:
            raise ExchangeError(f"prague: rank {self.rank} lost the group generator "
                                f"(rank 0): {exc.strerror or exc}") from exc

    def ask(self, steps: int, final: bool) -> Group | None:
        """This worker's next group, or None: the run has ended."""
        self._send({"op": "ready", "rank": self.rank, "steps": steps, "final": final})
        while b"\n" not in self._buffer:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise ExchangeTimeout(f"prague: rank {self.rank} waited {self.timeout_s:g} s "
                                      "for a group from the group generator") from None
            except OSError as exc:
                raise ExchangeError(f"prague: rank {self.rank} lost the group generator "
                                    f"(rank 0): {exc.strerror or exc}") from exc
            if not data:
                raise ExchangeError(f"prague: rank {self.rank} lost the group generator "
                                    "(rank 0 closed the connection)")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply = json.loads(line)
        if reply.get("stop"):
            return None
        return Group(int(reply["seq"]), tuple(reply["group"]), int(reply["round"]))

    def close(self) -> None:
        self.sock.close()
