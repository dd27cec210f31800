"""The switch service: the pure dataplane behind a UDP socket, and a TLS control plane.

``dlcomm switch serve --bind HOST:PORT`` listens for packets on UDP HOST:PORT and for
control connections (TLS) on TCP HOST:PORT. One thread runs the packet loop; an asyncio
event loop in another serves every control connection and the janitor
(:mod:`.control`). ``--drop-rate p`` drops each received and each sent datagram with
probability p (loss injection for tests and benchmarks).

The packet loop never dies on input: every datagram and every send has its own exception
boundary, counted by reason and logged once per reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from dlcomm.sockets import OUT_OF_RESOURCES, set_buffers
from dlcomm.switch.control import ControlPlane, line_limit
from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.groups import is_loopback
from dlcomm.switch.jobs import JobTable
from dlcomm.switch.log import say_once
from dlcomm.switch.registrations import Limits, SwitchState
from dlcomm.switch.security import Identity
from dlcomm.switch.sending import send_outputs
from dlcomm.wire.packet import max_elements

if TYPE_CHECKING:
    from dlcomm.native.switch import Core
    from dlcomm.switch.native_loop import NativeLoop

__all__ = ["SwitchServer", "DATAPLANES"]

DATAPLANES = ("native", "python")


def _udp(reuse_port: bool) -> socket.socket:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if reuse_port:
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return udp


def _bind_pair(host: str, port: int, reuse_port: bool = False,
               attempts: int = 32) -> tuple[socket.socket, socket.socket]:
    """A UDP socket and a TCP listener on the same port of ``host``. With port 0 the kernel
    picks the UDP port, which may be taken for TCP: then another one is tried."""
    for _ in range(attempts if port == 0 else 1):
        udp = _udp(reuse_port)
        try:
            set_buffers(udp)
            udp.bind((host, port))
            tcp = socket.create_server(udp.getsockname(), reuse_port=False, backlog=512)
            return udp, tcp
        except OSError:
            udp.close()
            if port != 0:
                raise
    raise OSError(f"no port of {host} was free for both UDP and TCP in {attempts} tries")


class SwitchServer:
    def __init__(self, host: str, port: int, identity: Identity, slots: int = 1024,
                 max_k: int | None = None, drop_rate: float = 0.0, seed: int = 0,
                 job_timeout_s: float = 600.0, token: str | None = None,
                 limits: Limits = Limits(), dataplane: str = "native", threads: int = 1) -> None:
        if not 0 <= drop_rate < 1:
            raise ValueError(f"drop rate must be in [0, 1), got {drop_rate}")
        if dataplane not in DATAPLANES:
            raise ValueError(f"the dataplane is one of {', '.join(DATAPLANES)}, got {dataplane}")
        if not 1 <= threads <= 64 or (threads > 1 and dataplane != "native"):
            raise ValueError(f"threads must be 1..64 (more than 1 with the native dataplane "
                             f"only), got {threads}")
        table = JobTable(slots, max_k or max_elements())
        self.core: Core | None = None
        if dataplane == "native":
            # every module the packet loops need is imported now: an import after the
            # control plane accepts may find every file descriptor taken by a flood
            from dlcomm.native.switch import Core
            from dlcomm.switch.native_dataplane import NativeDataplane
            from dlcomm.switch.native_loop import NativeLoop

            self._native_loop_type: type[NativeLoop] = NativeLoop
            self.core = Core()
            self.state = SwitchState(table, NativeDataplane(table, self.core))
        else:
            self.state = SwitchState(table, Dataplane(table))
        self.dataplane = dataplane
        self.identity = identity
        self.drop_rate = drop_rate
        self.rng = random.Random(seed)
        self.timing: dict[str, float] = {"recv_s": 0.0, "dataplane_s": 0.0, "send_s": 0.0}
        self.started = time.time()
        self.udp, self.tcp = _bind_pair(host, port, reuse_port=threads > 1)
        self.address: tuple[str, int] = self.udp.getsockname()
        self.sockets = [self.udp]
        for _ in range(threads - 1):
            extra = _udp(True)
            set_buffers(extra)
            extra.bind(self.address)
            self.sockets.append(extra)
        for udp in self.sockets:
            if host not in ("0.0.0.0", ""):  # results to multicast groups leave through HOST
                udp.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(host))
            udp.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            udp.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
        self.native_loop: NativeLoop | None = None
        self.control = ControlPlane(self.state, self._send_udp, token, limits, job_timeout_s,
                                    self.stats,
                                    # a group sent through lo reaches this host's workers
                                    loopback_multicast=is_loopback(host))
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_stop: asyncio.Event | None = None
        self._logged: set[str] = set()
        self.fatal: BaseException | None = None

    @property
    def counters(self) -> Any:
        return self.state.counters

    def _count(self, reason: str, detail: str) -> None:
        self.state.counters[reason] += 1
        say_once(self._logged, reason, detail)

    def _send_udp(self, data: bytes, addr: tuple[str, int]) -> None:
        self.udp.sendto(data, addr)

    # -- packets -----------------------------------------------------------------------
    def serve_native(self) -> None:
        """The packet loops in C (:mod:`dlcomm.switch.native_loop`)."""
        assert self.core is not None
        self.native_loop = self._native_loop_type(
            self.core, self.state, self.sockets, self.drop_rate, self.rng.randrange(1 << 30),
            lambda: self._call_control(self.control.tell_failures), self._stop, self._count)
        self.native_loop.run()

    def serve_packets(self) -> None:
        """The hot loop. It also times its three parts (a few perf_counter calls per
        packet), so that the counters say where the switch's time goes: waiting in and
        copying out of recv, the dataplane (checks, tags, int32 additions), and sending."""
        buf = bytearray(1 << 16)
        view = memoryview(buf)
        sock, state, drop, rng = self.udp, self.state, self.drop_rate, self.rng
        dp, lock, counters = state.dataplane, state.lock, state.counters
        clock = time.perf_counter
        timing = self.timing
        sock.settimeout(0.2)
        while not self._stop.is_set():
            t0 = clock()
            try:
                n, src = sock.recvfrom_into(buf)
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                self._count("recv_errors", f"receiving failed: {exc}")
                continue
            t1 = clock()
            timing["recv_s"] += t1 - t0
            if drop and rng.random() < drop:
                counters["drop_injected_in"] += 1
                continue
            try:
                with lock:
                    outputs = dp.on_datagram(view[:n], src, time.monotonic())
            except Exception as exc:  # noqa: BLE001 (no datagram may end the loop)
                self._count("dataplane_errors", f"a datagram raised {exc!r}")
                continue
            t2 = clock()
            timing["dataplane_s"] += t2 - t1
            if dp.failures:  # a job failed: its workers hear it on the control channel now
                self._call_control(self.control.tell_failures)
            send_outputs(sock, outputs, drop, rng, counters, self._count)
            timing["send_s"] += clock() - t2

    def _call_control(self, func: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(func)

    # -- control -------------------------------------------------------------------------
    async def _control_main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(self._loop_exception)
        self._async_stop = asyncio.Event()
        limits = self.control.limits
        server = await asyncio.start_server(
            self.control.connection, sock=self.tcp, ssl=self.identity.context,
            ssl_handshake_timeout=limits.handshake_s, limit=line_limit())
        janitor = asyncio.create_task(self.control.janitor(self._async_stop))
        ready.set()
        async with server:
            await self._async_stop.wait()
        janitor.cancel()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """A failed accept (no file descriptors) is counted and logged once, not a
        traceback a second for as long as a flood lasts; anything else as asyncio would.
        asyncio reports a failed accept with the listening socket in the context."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in OUT_OF_RESOURCES and \
                context.get("socket") is not None:
            self.control.count("accept_errors")
            self.control.log_once("accept_errors", "cannot accept a control connection "
                                  f"({exc.strerror}); accepting again in a second")
            return
        loop.default_exception_handler(context)

    def _control_thread(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._control_main(ready))
        except BaseException as exc:  # noqa: BLE001 (the service stops with its reason)
            self.fatal = exc
            self._stop.set()
            ready.set()

    # -- lifecycle ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self.state.lock:
            table, dp = self.state.table, self.state.dataplane
            now = time.monotonic()
            dp.sync(now)
            jobs = {str(j.job_id): {"name": j.name, "workers": j.workers, "live": j.live,
                                    "slots": j.slot_count, "k": j.k, "failure": j.failure,
                                    "waiting": dp.waiting(j.job_id, now), **j.counters}
                    for j in table.jobs.values()}
            counters = dp.all_counters()
            slots_in_use = table.slots_in_use()
        counters.update(dict(self.state.counters))  # one copy: the loop thread may add keys
        return {"address": f"{self.address[0]}:{self.address[1]}", "counters": counters,
                "slots_total": table.total_slots, "slots_in_use": slots_in_use,
                "jobs": jobs, "control": self.control.stats_of_jobs(),
                "uptime_s": time.time() - self.started, "cpu_s": time.process_time(),
                "time_s": {k: round(v, 6) for k, v in self.timing.items()},
                "drop_rate": self.drop_rate, "fingerprint": self.identity.fingerprint,
                "dataplane": self.dataplane,
                **({"native": self.native_loop.stats()} if self.native_loop else {})}

    def run(self) -> None:
        """Serve until :meth:`stop`; raise what ended the control plane, if anything did."""
        ready = threading.Event()
        control = threading.Thread(target=self._control_thread, args=(ready,), daemon=True,
                                   name="dlcomm-switch-control")
        control.start()
        ready.wait()
        try:
            if self.core is not None:
                self.serve_native()
            else:
                self.serve_packets()
        finally:
            self.stop()
            control.join(timeout=5)
            self.close_sockets()
        if self.fatal is not None:
            raise self.fatal

    def stop(self) -> None:
        self._stop.set()
        loop, flag = self._loop, self._async_stop
        if loop is not None and flag is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(flag.set)
        if self.core is not None:
            self.core.stop()
        if self.native_loop is None:   # the native loop closes them once its threads ended
            self.close_sockets()

    def close_sockets(self) -> None:
        for udp in self.sockets:
            with contextlib.suppress(OSError):
                udp.close()

