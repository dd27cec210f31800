"""Live switches on loopback for the attack tests, and an attacker's tools.

- :func:`live_switch`: a :class:`~dlcomm.switch.server.SwitchServer` in a thread of the test
  process (its state can be inspected), with the limits, token and timeouts a test needs;
- :class:`Line`, :func:`own_job`, :func:`drain`: the attacker's tools
  (:mod:`dlcomm.testing.tenant`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dlcomm.switch.registrations import Limits
from dlcomm.switch.security import identity
from dlcomm.switch.server import SwitchServer
from dlcomm.testing.tenant import Line, OwnJob, drain, own_job

__all__ = ["Live", "live_switch", "Line", "OwnJob", "own_job", "drain"]

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
                slots: int = 64, dataplane: str | None = None, threads: int = 1
                ) -> Iterator[Live]:
    """A switch in this process; its dataplane is $DLCOMM_DATAPLANE's (native by default),
    so that the suite runs against both (the Makefile's test target runs it twice)."""
    server = SwitchServer("127.0.0.1", 0, identity("127.0.0.1"), slots=slots,
                          job_timeout_s=job_timeout_s, token=token, limits=limits,
                          dataplane=dataplane or os.environ.get("DLCOMM_DATAPLANE", "native"),
                          threads=threads)
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
