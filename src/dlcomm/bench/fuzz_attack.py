"""The attackers of ``dlcomm bench fuzz``: datagrams and control lines at a live switch.

:class:`DatagramAttack` plays three targets at once, from loopback sources of its own:

- a dense job it owns (4 ranks: it holds the keys, so its rounds complete and its bent
  packets reach the dataplane's deepest checks);
- a sparse job it owns (3 ranks: announce rounds, planned rounds, look-ahead exponents);
- the honest job it does not own (its number, ranks, slots and size read from the switch's
  stats, as a co-tenant on loopback could): forgeries sealed with wrong keys, headers with
  junk tags, random bytes, all from addresses the job did not register.

An owned job that fails (a bent packet makes its workers disagree) is registered anew from
another loopback source (127.0.0.0/8), so that the registration rate limit per source,
which the control attack meets, does not stop the campaign. Every datagram that comes back
to an attacker's socket is counted: amplification is what came back over what was sent,
in packets and in bytes. The caller paces the sender by the bytes waiting at the switch's
socket (its receive queue), so that the kernel does not drop what the switch should
see.

:class:`ControlAttack` sends :class:`~dlcomm.testing.control_fuzz.ControlMutator` lines over
a few pinned TLS connections, each from a new loopback source (127.1.0.0/16) and used for
200 lines, pipelined in batches, reading every reply; connections the switch closes (a line
too long) are opened again.
"""

from __future__ import annotations

import contextlib
import secrets
import selectors
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dlcomm.testing.control_fuzz import ControlMutator
from dlcomm.testing.fuzz import FuzzTarget, Mutator
from dlcomm.testing.tenant import Line, OwnJob, own_job
from dlcomm.wire.auth import AUTH_MODES, JobKeys
from dlcomm.wire.channel import Channel

__all__ = ["DatagramAttack", "ControlAttack", "Counts"]

Address = tuple[str, int]
_SHARES = (("dense", 0.4), ("sparse", 0.3), ("honest", 0.3))


@dataclass(frozen=True)
class _Shape:
    workers: int
    k: int
    slots: int
    block: int = 0


_OWN = {"dense": _Shape(4, 64, 8), "sparse": _Shape(3, 256, 8, 16)}


@dataclass
class Counts:
    sent: int = 0
    sent_bytes: int = 0
    back: int = 0
    back_bytes: int = 0
    kinds: Counter[str] = field(default_factory=Counter)


class _Replies:
    """Counts every datagram that reaches the attacker's sockets (a thread of its own)."""

    def __init__(self, counts: Counts) -> None:
        self.counts, self.lock = counts, threading.Lock()
        self.selector = selectors.DefaultSelector()
        self.socks: dict[int, socket.socket] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="fuzz-replies")
        self.thread.start()

    def watch(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        with self.lock:
            self.socks[sock.fileno()] = sock
            self.selector.register(sock, selectors.EVENT_READ)

    def forget(self, sock: socket.socket) -> None:
        with self.lock, contextlib.suppress(KeyError, ValueError):
            self.socks.pop(sock.fileno(), None)
            self.selector.unregister(sock)

    def _run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                ready = self.selector.select(0.05) if self.selector.get_map() else []
            if not ready:
                time.sleep(0.001)
            for key, _ in ready:
                sock = self.socks.get(key.fd)
                while sock is not None:
                    try:
                        data = sock.recv(1 << 16)
                    except (BlockingIOError, OSError):
                        break
                    self.counts.back += 1
                    self.counts.back_bytes += len(data)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.selector.close()


class DatagramAttack:
    """Mutated and random datagrams at a live switch (module docstring)."""

    def __init__(self, address: Address, fp: str, seed: int) -> None:
        self.address, self.fp, self.seed = address, fp, seed
        self.counts = Counts()
        self.replies = _Replies(self.counts)
        self.sources = (f"127.0.{i // 250}.{3 + i % 250}" for i in range(1 << 16))
        self.owned: dict[str, tuple[OwnJob, Mutator]] = {}
        self.reregistered = 0
        self.retired: dict[str, Counter[str]] = {name: Counter() for name in _OWN}
        self.completions: dict[int, int] = {}   # owned job -> rounds it completed
        self.honest: tuple[int, Mutator] | None = None
        self.strangers = [self._stranger() for _ in range(2)]
        for name in _OWN:
            self._register(name)

    def _stranger(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((next(self.sources), 0))
        self.replies.watch(sock)
        return sock

    def _register(self, name: str) -> None:
        old = self.owned.pop(name, None)
        if old is not None:
            self.retired[name].update(old[1].made)
            for sock in old[0].socks:
                self.replies.forget(sock)
            old[0].close()
        shape = _OWN[name]
        own = own_job(self.address, self.fp, shape.workers, shape.k, shape.slots, shape.block,
                      host=next(self.sources))
        target = FuzzTarget(own.job, shape.workers, shape.slots, shape.k, shape.block,
                            tuple(own.channels))
        self.owned[name] = (own, Mutator(target, self.seed * 7919 + own.job))
        for sock in own.socks:
            self.replies.watch(sock)

    def aim(self, jobs: dict[str, dict[str, Any]]) -> None:
        """Read the honest job and the state of the owned ones from the switch's stats."""
        mine = {own.job: name for name, (own, _) in self.owned.items()}
        for j, info in jobs.items():
            if int(j) in mine:
                self.completions[int(j)] = int(info.get("completions", 0))
        for job, name in mine.items():   # failed, or gone (ended by the switch): anew
            if str(job) not in jobs or jobs[str(job)].get("failure"):
                self.reregistered += 1
                self._register(name)
        honest = [(int(j), info) for j, info in jobs.items()
                  if str(info.get("name", "")).startswith("honest") and info.get("live")]
        if not honest:
            self.honest = None   # between honest runs: its share goes to the owned jobs
        elif self.honest is None or self.honest[0] != honest[0][0]:
            job, info = honest[0]
            forged = secrets.token_bytes(32)  # keys the attacker guesses: every tag fails
            channels = tuple(Channel(JobKeys.derive(forged, job, AUTH_MODES["authenticated"],
                                                    [r]), r) for r in range(info["workers"]))
            target = FuzzTarget(job, info["workers"], info["slots"], info["k"], 0, channels)
            self.honest = (job, Mutator(target, self.seed * 104729 + job))

    def send(self, count: int) -> None:
        """Send ``count`` datagrams, shared among the targets."""
        rng = self.owned["dense"][1].rng
        for _ in range(count):
            name = rng.choices([n for n, _ in _SHARES], [w for _, w in _SHARES])[0]
            if name == "honest":
                if self.honest is None:
                    name = "dense"
                else:
                    datagram, _ = self.honest[1].next()
                    self._out(self.strangers[rng.randrange(2)], datagram, "honest")
                    continue
            own, mutator = self.owned[name]
            datagram, rank = mutator.next()
            sock = own.socks[rank] if 0 <= rank < len(own.socks) else \
                self.strangers[rng.randrange(2)]
            self._out(sock, datagram, name)

    def _out(self, sock: socket.socket, datagram: bytes, kind: str) -> None:
        while True:
            try:
                sock.sendto(datagram, self.address)
                break
            except BlockingIOError:
                time.sleep(0.0005)
            except OSError:
                return   # e.g. a datagram too long to send: nothing left the host
        self.counts.sent += 1
        self.counts.sent_bytes += len(datagram)
        self.counts.kinds[kind] += 1

    def made(self) -> dict[str, dict[str, int]]:
        out = {name: dict(self.retired[name] + Counter(m.made))
               for name, (_, m) in self.owned.items()}
        if self.honest is not None:
            out["honest"] = dict(self.honest[1].made)
        return out

    def close(self) -> None:
        time.sleep(0.3)  # the last answers arrive
        self.replies.close()
        for own, _ in self.owned.values():
            own.close()
        for sock in self.strangers:
            sock.close()


class ControlAttack:
    """Hostile control lines over pinned TLS connections (module docstring)."""

    def __init__(self, address: Address, fp: str, seed: int, connections: int = 4,
                 batch: int = 32, lines_per_connection: int = 200) -> None:
        self.address, self.fp, self.batch = address, fp, batch
        self.lines_per_connection = lines_per_connection
        self.mutator = ControlMutator(seed)
        # a new loopback source for every connection (127.1.0.0/16): hostile registrations
        # reach the field checks, not only the rate limit per source
        self.sources = (f"127.1.{i // 250 % 250}.{1 + i % 250}" for i in range(1 << 30))
        self.kinds: Counter[str] = Counter()    # the kinds of the lines actually sent
        self.sent = self.replies = self.closed = self.errors = 0
        self.reply_kinds: Counter[str] = Counter()
        self.lines = [self._connect() for _ in range(connections)]
        self.used = [0] * connections

    def _connect(self) -> Line:
        return Line(self.address, self.fp, source=next(self.sources), timeout=10.0)

    def send(self, count: int) -> None:
        """Send ``count`` lines, ``batch`` at a time per connection, reading the replies."""
        while count > 0:
            for i, line in enumerate(self.lines):
                n = min(self.batch, count)
                if n <= 0:
                    return
                if self.used[i] >= self.lines_per_connection:
                    line.close()
                    line, self.used[i] = self._connect(), 0
                self.lines[i] = self._exchange(line, n)
                self.used[i] += n
                count -= n

    def _exchange(self, line: Line, n: int) -> Line:
        out = [self.mutator.next() for _ in range(n)]
        limit = self.mutator.line_limit
        long = next((i for i, (text, _) in enumerate(out) if len(text) > limit), None)
        if long is not None:
            out = out[: long + 1]   # nothing is read after an over-long line
        try:
            line.send_raw(b"".join(text for text, _ in out))
            self.sent += len(out)
            self.kinds.update(kind for _, kind in out)
            for _ in out:
                reply = line.recv(10.0)
                if reply is None:
                    raise ConnectionError("closed")
                self.replies += 1
                self.reply_kinds["ok" if reply.get("ok") else "error"] += 1
        except (ConnectionError, OSError, ValueError):
            self.closed += 1
            line.close()
            return self._connect()
        if long is not None:   # answered, then closed by the switch
            self.closed += 1
            line.close()
            return self._connect()
        return line

    def close(self) -> None:
        for line in self.lines:
            line.close()
