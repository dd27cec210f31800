"""SIGINT, SIGTERM and SIGHUP as exceptions, so that a stopped job cleans up after itself.

Within :func:`interrupts_raised`, these signals raise :class:`Interrupted`: ``with`` blocks
unwind (workers are stopped, namespaces and job directories removed) and the command exits
with 128 + the signal's number. Cleanup runs under :func:`interrupts_ignored`, so that a
second signal cannot cut it short. Only the main thread gets signals and may set handlers;
elsewhere both are no-ops.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from dlcomm.errors import DlcommError

__all__ = ["Interrupted", "interrupts_raised", "interrupts_ignored", "SIGNALS"]

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(DlcommError):
    """The launcher received SIGINT, SIGTERM or SIGHUP and stopped the job."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}; all workers stopped")
        self.exit_code = 128 + signum


@contextlib.contextmanager
def interrupts_raised() -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM/SIGHUP raise :class:`Interrupted`, so that ``with``
    blocks unwind and clean up (do the cleanup under :func:`interrupts_ignored`)."""
    with _handlers(_raise_interrupted):
        yield


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM/SIGHUP are ignored: cleanup must not be cut short."""
    with _handlers(signal.SIG_IGN):
        yield


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _handlers(handler: Any) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        for s in SIGNALS:
            signal.signal(s, handler)
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
