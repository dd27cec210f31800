"""The switch's packets served by native code: threads in C, and two small Python loops.

- ``threads`` packet loops (:meth:`dlcomm.native.switch.Core.serve`), one per UDP socket;
  the sockets share the switch's port (SO_REUSEPORT: the kernel spreads the workers' flows
  over them) and the C code runs without the GIL;
- the slow path: datagrams of the jobs the Python dataplane serves (sparse jobs, jobs of
  more than 64 workers) come up one at a time and are answered from Python, as
  :meth:`dlcomm.switch.server.SwitchServer.serve_packets` does;
- the watcher: every 0.1 s (at once when a job fails) it brings the native jobs' objects up
  to date (counters, last packet, failure), so the janitor, statistics and failure events
  of the control plane work as with the Python dataplane.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from random import Random
from typing import Any

from dlcomm.native.switch import Core
from dlcomm.switch.registrations import SwitchState
from dlcomm.switch.sending import send_outputs

__all__ = ["NativeLoop"]


class NativeLoop:
    def __init__(self, core: Core, state: SwitchState, sockets: list[socket.socket],
                 drop_rate: float, seed: int, tell_failures: Callable[[], None],
                 stopped: threading.Event, count: Callable[[str, str], None]) -> None:
        self.core, self.state, self.sockets = core, state, sockets
        self.drop_rate, self.seed = drop_rate, seed
        self.tell_failures, self.stopped = tell_failures, stopped
        self.cpu_s: list[float] = [0.0] * len(sockets)
        self._count = count   # counted by reason, logged once (the server's)
        self.fatal: BaseException | None = None   # what ended a thread, and so the switch

    def _guarded(self, target: Callable[..., None], *args: int) -> None:
        """Run a thread's loop; if it fails (a packet loop that cannot allocate its buffers,
        say), the switch stops with the reason rather than serve on without that thread."""
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 (told to the service, which stops)
            self.fatal = exc
            self.stopped.set()

    def _packets(self, index: int) -> None:
        self.cpu_s[index] = self.core.serve(self.sockets[index].fileno(), self.drop_rate,
                                            self.seed * 1000 + index)

    def _slow_path(self) -> None:
        buf = bytearray(1 << 16)
        view = memoryview(buf)
        state, sock, rng = self.state, self.sockets[0], Random(self.seed)
        while not self.stopped.is_set():
            n, src = self.core.slow_next(buf, 0.2)
            if n < 0:
                return
            if n == 0:
                continue
            if self.drop_rate and rng.random() < self.drop_rate:
                state.counters["drop_injected_in"] += 1
                continue
            try:
                with state.lock:
                    outputs = state.dataplane.on_datagram(view[:n], src, time.monotonic())
            except Exception as exc:  # noqa: BLE001 (no datagram may end the loop)
                self._count("dataplane_errors", f"a datagram raised {exc!r}")
                continue
            if state.dataplane.failures:
                self.tell_failures()
            send_outputs(sock, outputs, self.drop_rate, rng, state.counters, self._count)

    def _watch(self) -> None:
        while not self.stopped.is_set():
            self.core.take_failures(0.1)
            with self.state.lock:
                failed = self.state.dataplane.sync(time.monotonic())
            if failed:
                self.tell_failures()

    def run(self) -> None:
        """Serve until ``stopped`` is set (then :meth:`Core.stop` ends the C loops)."""
        threads = [threading.Thread(target=self._guarded, args=(self._packets, i),
                                    daemon=True, name=f"dlcomm-switch-native-{i}")
                   for i in range(len(self.sockets))]
        threads += [threading.Thread(target=self._guarded, args=(self._slow_path,),
                                     daemon=True, name="dlcomm-switch-slow-path")]
        try:
            for thread in threads:
                thread.start()
            self._watch()
        finally:
            self.core.stop()
            for thread in threads:
                if thread.ident is not None:   # started
                    thread.join(timeout=5)
            if not any(t.is_alive() for t in threads):
                with self.state.lock:
                    self.core.close()   # nothing runs in it any more
        if self.fatal is not None:
            raise self.fatal

    def stats(self) -> dict[str, Any]:
        return {"threads": len(self.sockets), "thread_cpu_s": [round(c, 6) for c in self.cpu_s]}
