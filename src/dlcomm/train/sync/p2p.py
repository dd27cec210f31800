"""Tagged point-to-point messages over the default gloo process group, with deadlines.

One receiver thread per channel (a peer and a tag) keeps a receive posted, so a peer's
messages never stall behind each other on the shared connection; each message goes to a
handler that updates the protocol's pure state under the mailbox's condition variable.
The worker's own thread waits on that condition with a deadline:

- a wait that exceeds ``timeout_s`` raises :class:`ExchangeTimeout` naming what it waited
  for and from which ranks;
- a receive that fails (the peer's process died and its connection closed, or gloo's own
  deadline passed) raises :class:`ExchangeError` naming the peer, in the waiting thread.

Bytes are counted per message payload (``counting = "payload"``: our tensors, not gloo's
framing).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from dlcomm.errors import ExchangeError, ExchangeTimeout

__all__ = ["Mailbox", "Pending"]

T = TypeVar("T")
Handler = Callable[[int, torch.Tensor], bool]  # (sender, message) -> True: channel closed


class Mailbox:
    """Receiver threads, sends in flight, and deadline-bounded waits of one worker."""

    def __init__(self, rank: int, timeout_s: float, what: str = "sync") -> None:
        self.rank = rank
        self.timeout_s = timeout_s
        self.what = what
        self.cond = threading.Condition()
        self.error: str | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self._threads: list[threading.Thread] = []
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []

    # ---- receiving ---------------------------------------------------------------
    def listen(self, src: int | None, tag: int, numel: int, dtype: torch.dtype,
               handler: Handler) -> None:
        """Receive ``numel``-element messages from ``src`` (None: anyone) on ``tag`` until
        ``handler`` returns True. The handler runs with ``cond`` held."""
        def loop() -> None:
            peer = "any rank" if src is None else f"rank {src}"
            try:
                while True:
                    buf = torch.empty(numel, dtype=dtype)
                    sender = dist.recv(buf, src=src, tag=tag)
                    with self.cond:
                        self.bytes_received += buf.numel() * buf.element_size()
                        closed = handler(int(sender), buf)
                        self.cond.notify_all()
                    if closed:
                        return
            except Exception as exc:  # the I/O edge: a dead or silent peer
                with self.cond:
                    if self.error is None:
                        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                        self.error = f"{self.what}: rank {self.rank} lost {peer}: {cause}"
                    self.cond.notify_all()

        thread = threading.Thread(target=loop, daemon=True,
                                  name=f"dlcomm-{self.what}-recv-{src}-{tag}")
        self._threads.append(thread)
        thread.start()


    def irecv(self, src: int, tag: int, numel: int, dtype: torch.dtype) -> Pending:
        """Post a receive now; ``.wait()`` returns the message (gloo's deadline applies)."""
        buf = torch.empty(numel, dtype=dtype)
        return Pending(self, src, buf, dist.irecv(buf, src=src, tag=tag))

    # ---- sending -----------------------------------------------------------------
    def send(self, dst: int, tag: int, tensor: torch.Tensor) -> None:
        """Start sending ``tensor`` (kept alive until sent)."""
        try:
            work = dist.isend(tensor, dst=dst, tag=tag)
        except Exception as exc:
            raise ExchangeError(f"{self.what}: rank {self.rank} cannot send to rank {dst}: "
                                f"{exc}") from exc
        with self.cond:
            self.bytes_sent += tensor.numel() * tensor.element_size()
            self._sends = [(w, t) for w, t in self._sends if not w.is_completed()]
            self._sends.append((work, tensor))

    def flush(self) -> None:
        """Wait until every send has left (gloo's deadline applies)."""
        with self.cond:
            sends, self._sends = self._sends, []
        for work, _ in sends:
            try:
                work.wait()
            except Exception as exc:
                raise ExchangeError(f"{self.what}: rank {self.rank}: a send failed: "
                                    f"{str(exc).splitlines()[0]}") from exc

    # ---- waiting -----------------------------------------------------------------
    def wait_for(self, poll: Callable[[], T | None], waiting_for: Callable[[], str]) -> T:
        """Call ``poll`` (under ``cond``) until it returns a value; raise after the
        deadline. ``waiting_for()`` describes what is missing, for the error."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            while True:
                value = poll()
                if value is not None:
                    return value
                if self.error is not None:
                    raise ExchangeError(self.error)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ExchangeTimeout(f"{self.what}: rank {self.rank} waited "
                                          f"{self.timeout_s:g} s for {waiting_for()}")
                self.cond.wait(min(remaining, 1.0))

    def counters(self) -> tuple[int, int]:
        with self.cond:
            return self.bytes_sent, self.bytes_received

    def check(self) -> None:
        with self.cond:
            if self.error is not None:
                raise ExchangeError(self.error)

    def join(self, waiting_for: str) -> None:
        """Wait for every channel to close (its peer said goodbye), with the deadline."""
        deadline = time.monotonic() + self.timeout_s
        for thread in self._threads:
            while thread.is_alive():
                self.check()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ExchangeTimeout(f"{self.what}: rank {self.rank} waited "
                                          f"{self.timeout_s:g} s for {waiting_for}")
                thread.join(min(remaining, 0.5))
        self.check()
        self.flush()


class Pending:
    """A posted receive of a :class:`Mailbox`."""

    def __init__(self, mail: Mailbox, src: int, buf: torch.Tensor, work: dist.Work) -> None:
        self.mail, self.src, self.buf, self.work = mail, src, buf, work

    def wait(self) -> torch.Tensor:
        try:
            self.work.wait()
        except Exception as exc:
            raise ExchangeError(f"{self.mail.what}: rank {self.mail.rank} lost rank "
                                f"{self.src}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                                ) from exc
        with self.mail.cond:
            self.mail.bytes_received += self.buf.numel() * self.buf.element_size()
        return self.buf
