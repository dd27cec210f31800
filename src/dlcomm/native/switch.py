"""The native switch dataplane and packet loop, as Python objects (a thin ctypes shell).

:class:`Core` owns one C switch: its job table (filled by the control plane in Python), its
counters, the failures it found, the slow path to the Python dataplane, and
:meth:`Core.serve`, one packet loop on one socket (call it from as many threads as there are
sockets: the GIL is released for as long as it runs). :class:`Probe` drives the same
dataplane one datagram at a time without sockets (the differential tests).
"""

from __future__ import annotations

import ctypes as C
import ipaddress
import socket
from dataclasses import dataclass

from dlcomm.native.lib import counter_names, load, offload

__all__ = ["Core", "Probe", "JobSpec", "JobInfo", "ip_int", "ip_str", "outputs_of",
           "MAX_NATIVE_WORKERS"]

MAX_NATIVE_WORKERS = 64   # a round's bitmap is one u64; larger jobs run in the Python dataplane
_OUT_CAP = 1 << 22


def ip_int(host: str) -> int:
    return int(ipaddress.IPv4Address(host))


def ip_str(value: int) -> str:
    return socket.inet_ntoa(value.to_bytes(4, "big"))


def outputs_of(raw: bytes, n: int) -> list[tuple[tuple[str, int], bytes]]:
    """The datagrams the native code serialised for the pure calls: records of ip (u32),
    port (u16), length (u32) and bytes, ``n`` bytes in all (< 0: they did not fit)."""
    if n < 0:
        raise RuntimeError("native outputs overflowed the test buffer")
    outs, at = [], 0
    while at < n:
        ip = int.from_bytes(raw[at:at + 4], "little")
        port = int.from_bytes(raw[at + 4:at + 6], "little")
        size = int.from_bytes(raw[at + 6:at + 10], "little")
        outs.append(((ip_str(ip), port), raw[at + 10:at + 10 + size]))
        at += 10 + size
    return outs


@dataclass(frozen=True)
class JobSpec:
    """What the native dataplane needs of a job (dlcomm.switch.jobs.Job)."""

    job_id: int
    addresses: tuple[tuple[str, int], ...]
    slot_count: int
    k: int
    limit: int
    auth: int
    keys: bytes                              # wire/auth.all_key_bytes, b"" in mode none
    group: tuple[str, int] | None = None
    python: bool = False                     # served by the Python dataplane (slow path)
    block: int = 0                           # sparse rounds: the block size (0: dense only)


@dataclass(frozen=True)
class JobInfo:
    counters: dict[str, int]
    last_packet: float
    failure: str
    waiting: dict[str, object] | None


class Core:
    """One native switch (see the module docstring)."""

    def __init__(self) -> None:
        self.lib = load()
        self.names = counter_names()
        handle = self.lib.dlc_switch_new()
        if not handle:
            raise MemoryError("cannot allocate the native switch")
        self.handle: int = handle
        self._final: dict[str, int] = {}

    def close(self) -> None:
        """Free the switch (no loop may run in it); its counters stay readable, every
        other call is then a no-op."""
        if self.handle:
            self._final = self.counters()
            self.lib.dlc_switch_free(self.handle)
            self.handle = 0

    # -- jobs ----------------------------------------------------------------------------
    def add_job(self, spec: JobSpec) -> None:
        if not self.handle:
            raise ValueError("the native switch is closed")
        n = len(spec.addresses)
        ips = (C.c_uint32 * n)(*[ip_int(h) for h, _ in spec.addresses])
        ports = (C.c_uint16 * n)(*[p for _, p in spec.addresses])
        keys = (C.c_uint8 * max(1, len(spec.keys))).from_buffer_copy(spec.keys or b"\0")
        group_ip, group_port = (ip_int(spec.group[0]), spec.group[1]) if spec.group else (0, 0)
        rc = self.lib.dlc_job_add(self.handle, spec.job_id, n, ips, ports, spec.slot_count,
                                  spec.k, spec.limit, spec.auth, keys, group_ip, group_port,
                                  int(spec.python))
        if rc == 0 and spec.block and not spec.python:
            rc = self.lib.dlc_job_sparse(self.handle, spec.job_id, spec.block)
            if rc:
                self.lib.dlc_job_remove(self.handle, spec.job_id)
        if rc == -2:
            raise MemoryError(f"cannot allocate job {spec.job_id}'s slots")
        if rc:
            raise ValueError(f"the native dataplane refused job {spec.job_id}")

    def remove_job(self, job_id: int) -> None:
        if self.handle:
            self.lib.dlc_job_remove(self.handle, job_id)

    def set_live(self, job_id: int, live: bool = True) -> None:
        if self.handle:
            self.lib.dlc_job_set_live(self.handle, job_id, int(live))

    def info(self, job_id: int, now: float) -> JobInfo | None:
        if not self.handle:
            return None
        counters = (C.c_uint64 * len(self.names))()
        last, since = C.c_double(), C.c_double()
        failure = C.create_string_buffer(512)
        waiting, slot, rnd = C.c_uint64(), C.c_int(), C.c_int64()
        if self.lib.dlc_job_info(self.handle, job_id, counters, C.byref(last), failure, 512,
                                 now, C.byref(waiting), C.byref(since), C.byref(slot),
                                 C.byref(rnd)):
            return None
        wait = None
        if slot.value >= 0:
            wait = {"ranks": [r for r in range(64) if waiting.value >> r & 1],
                    "since_s": round(since.value, 3), "slot": slot.value, "round": rnd.value}
        return JobInfo({n: v for n, v in zip(self.names, counters) if v}, last.value,
                       failure.value.decode(errors="replace"), wait)

    def take_failures(self, timeout_s: float) -> list[int]:
        if not self.handle:
            return []
        ids = (C.c_uint16 * 256)()
        n = self.lib.dlc_take_failures(self.handle, ids, 256, int(timeout_s * 1000))
        return list(ids[:n])

    def slow_next(self, buf: bytearray, timeout_s: float) -> tuple[int, tuple[str, int]]:
        """The next datagram for the Python dataplane: (length, source); 0 on timeout, -1
        once stopping."""
        ip, port = C.c_uint32(), C.c_uint16()
        raw = (C.c_char * len(buf)).from_buffer(buf)
        n = self.lib.dlc_slow_next(self.handle, raw, len(buf), C.byref(ip), C.byref(port),
                                   int(timeout_s * 1000))
        return n, (ip_str(ip.value), port.value) if n > 0 else ("", 0)

    def counters(self) -> dict[str, int]:
        if not self.handle:
            return dict(self._final)
        out = (C.c_uint64 * len(self.names))()
        self.lib.dlc_counters(self.handle, out)
        return {n: v for n, v in zip(self.names, out) if v}

    # -- the loop ----------------------------------------------------------------------
    def serve(self, fd: int, drop_rate: float = 0.0, seed: int = 0, gro: bool | None = None
              ) -> float:
        """Serve the socket ``fd`` until :meth:`stop`; returns this thread's CPU seconds."""
        cpu = C.c_int64()
        gro = offload() if gro is None else gro
        if self.lib.dlc_serve(self.handle, fd, drop_rate, seed, int(gro), C.byref(cpu)):
            raise MemoryError("cannot allocate a native packet loop")
        return cpu.value / 1e9

    def stop(self) -> None:
        if self.handle:
            self.lib.dlc_stop(self.handle)


class Probe:
    """The native dataplane one datagram at a time, no sockets: what it sends, as bytes."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.ctx = core.lib.dlc_ctx_new(core.handle, -1, 0.0, 0)
        if not self.ctx:
            raise MemoryError("cannot allocate a native context")
        self.out = C.create_string_buffer(_OUT_CAP)

    def close(self) -> None:
        if self.ctx:
            self.core.lib.dlc_ctx_free(self.ctx)
            self.ctx = 0

    def process(self, data: bytes, src: tuple[str, int], now: float
                ) -> list[tuple[tuple[str, int], bytes]] | None:
        """The datagrams ``data`` from ``src`` makes the switch send (None: slow path)."""
        buf = C.create_string_buffer(bytes(data), max(1, len(data)))
        n = self.core.lib.dlc_process_copy(self.ctx, buf, len(data), ip_int(src[0]), src[1],
                                           now, self.out, _OUT_CAP)
        if n == -1:
            return None
        return outputs_of(self.out.raw, n)
