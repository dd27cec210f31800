"""The switch service: the pure dataplane behind a UDP socket, and a TCP control channel.

``dlcomm switch serve --bind HOST:PORT`` listens for packets on UDP HOST:PORT and for
control connections on TCP HOST:PORT. One thread runs the packet loop; one thread per
control connection handles registration, attachment, statistics and departures; a janitor
frees the slots of jobs that went idle. ``--drop-rate p`` drops each received and each sent
datagram with probability p (loss injection for tests and benchmarks).
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections import Counter
from typing import Any

from dlcomm.sockets import set_buffers
from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import JobTable
from dlcomm.wire.control import decode_line, encode_line
from dlcomm.wire.packet import max_elements

__all__ = ["SwitchServer"]

class _Member:
    """A control connection attached to a job as one rank."""

    def __init__(self, conn: socket.socket, job: int, rank: int) -> None:
        self.conn, self.job, self.rank = conn, job, rank
        self.left = False
        self.lock = threading.Lock()

    def send(self, obj: dict[str, Any]) -> None:
        with self.lock, contextlib.suppress(OSError):
            self.conn.sendall(encode_line(obj))


def _bind_pair(host: str, port: int, attempts: int = 32) -> tuple[socket.socket, socket.socket]:
    """A UDP socket and a TCP listener on the same port of ``host``. With port 0 the kernel
    picks the UDP port, which may be taken for TCP: then another one is tried."""
    for _ in range(attempts if port == 0 else 1):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            set_buffers(udp)
            udp.bind((host, port))
            return udp, socket.create_server(udp.getsockname(), reuse_port=False)
        except OSError:
            udp.close()
            if port != 0:
                raise
    raise OSError(f"no port of {host} was free for both UDP and TCP in {attempts} tries")


class SwitchServer:
    def __init__(self, host: str, port: int, slots: int = 1024, max_k: int | None = None,
                 drop_rate: float = 0.0, seed: int = 0, job_timeout_s: float = 600.0) -> None:
        if not 0 <= drop_rate < 1:
            raise ValueError(f"drop rate must be in [0, 1), got {drop_rate}")
        self.table = JobTable(slots, max_k or max_elements())
        self.dataplane = Dataplane(self.table)
        self.lock = threading.Lock()
        self.drop_rate = drop_rate
        self.rng = random.Random(seed)
        self.job_timeout_s = job_timeout_s
        self.counters: Counter[str] = Counter()
        self.timing: dict[str, float] = {"recv_s": 0.0, "dataplane_s": 0.0, "send_s": 0.0}
        self.members: dict[int, list[_Member]] = {}
        self.started = time.time()
        self.udp, self.tcp = _bind_pair(host, port)
        if host not in ("0.0.0.0", ""):  # results to multicast groups leave through HOST
            self.udp.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(host))
        self.udp.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        self.udp.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
        self.address = self.udp.getsockname()
        self._stop = threading.Event()

    # -- packets -----------------------------------------------------------------------
    def serve_packets(self) -> None:
        """The hot loop. It also times its three parts (a few perf_counter calls per
        packet), so that the counters say where the switch's time goes: waiting in and
        copying out of recv, the dataplane (decode, checks, int32 additions), and sending."""
        buf = bytearray(1 << 16)
        view = memoryview(buf)
        sock, dp, lock, drop, rng = self.udp, self.dataplane, self.lock, self.drop_rate, self.rng
        clock = time.perf_counter
        timing = self.timing
        sock.settimeout(0.2)
        while not self._stop.is_set():
            t0 = clock()
            try:
                n, src = sock.recvfrom_into(buf)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                raise
            t1 = clock()
            timing["recv_s"] += t1 - t0
            if drop and rng.random() < drop:
                self.counters["drop_injected_in"] += 1
                continue
            with lock:
                outputs = dp.on_datagram(view[:n], src, time.monotonic())
            t2 = clock()
            timing["dataplane_s"] += t2 - t1
            for addr, header, body in outputs:
                if drop and rng.random() < drop:
                    self.counters["drop_injected_out"] += 1
                    continue
                try:
                    sent = sock.sendmsg([header.pack(), body], [], 0, addr)
                except OSError:
                    self.counters["send_errors"] += 1
                    continue
                self.counters["packets_out"] += 1
                self.counters["bytes_out"] += sent
            timing["send_s"] += clock() - t2

    # -- control -------------------------------------------------------------------------
    def serve_control(self) -> None:
        self.tcp.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        member: _Member | None = None
        with conn, conn.makefile("rb") as lines:
            try:
                for line in lines:
                    try:
                        reply, member = self._request(decode_line(line), conn, member)
                    except (ValueError, KeyError, TypeError) as exc:
                        reply = {"ok": False, "error": str(exc)}
                    if member is not None:
                        member.send(reply)
                    else:
                        conn.sendall(encode_line(reply))
            except OSError:
                pass
        if member is not None and not member.left:
            self._worker_died(member)

    def _request(self, req: dict[str, Any], conn: socket.socket, member: _Member | None
                 ) -> tuple[dict[str, Any], _Member | None]:
        op = req.get("op")
        if op == "ping":
            from dlcomm import __version__
            return {"ok": True, "version": __version__}, member
        if op == "stats":
            return {"ok": True, "stats": self.stats()}, member
        if op == "register":
            if member is not None:
                raise ValueError("this connection already belongs to a job")
            addresses = [(str(a), int(p)) for a, p in req["addresses"]]
            with self.lock:
                mport = req.get("multicast_port")
                job = self.table.register(addresses, int(req["slots"]), int(req["k"]),
                                          str(req.get("name", "")), time.monotonic(),
                                          int(mport) if mport is not None else None,
                                          int(req.get("block", 0)))
                self.dataplane.add_job(job)
                member = _Member(conn, job.job_id, 0)
                self.members[job.job_id] = [member]
            return {"ok": True, "job": job.job_id, "key": f"{job.key:016x}",
                    "slots": job.slot_count, "k": job.k,
                    "group": job.group[0] if job.group else None}, member
        if op == "attach":
            with self.lock:
                attached = self.table.jobs.get(int(req["job"]))
                if attached is None or f"{attached.key:016x}" != req["key"]:
                    raise ValueError(f"no job {req['job']} with that key")
                rank = int(req["rank"])
                if not 0 <= rank < attached.workers:
                    raise ValueError(f"rank {rank} is outside the job's {attached.workers} workers")
                member = _Member(conn, attached.job_id, rank)
                self.members.setdefault(attached.job_id, []).append(member)
            return {"ok": True}, member
        if op == "leave":
            if member is None:
                raise ValueError("this connection is not attached to a job")
            member.left = True
            with self.lock:
                group = self.members.get(member.job, [])
                if group and all(m.left for m in group):
                    self._end_job(member.job)
            return {"ok": True}, member
        raise ValueError(f"unknown op {op!r}")

    def _end_job(self, job_id: int) -> None:
        self.dataplane.remove_job(job_id)
        self.members.pop(job_id, None)

    def _worker_died(self, member: _Member) -> None:
        with self.lock:
            group = self.members.get(member.job)
            if group is None:
                return
            self._end_job(member.job)
            self.counters["jobs_failed"] += 1
        for other in group:
            if other is not member:
                other.send({"event": "worker_left", "job": member.job, "rank": member.rank})

    def janitor(self) -> None:
        while not self._stop.wait(1.0):
            with self.lock:
                idle = self.table.idle(time.monotonic(), self.job_timeout_s)
                groups = [(j, self.members.get(j, [])) for j in idle]
                for job_id in idle:
                    self._end_job(job_id)
                    self.counters["jobs_timed_out"] += 1
            for job_id, group in groups:
                for member in group:
                    member.send({"event": "job_timeout", "job": job_id})

    # -- lifecycle ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self.lock:
            jobs = {str(j.job_id): {"name": j.name, "workers": j.workers,
                                    "slots": j.slot_count, "k": j.k, **j.counters}
                    for j in self.table.jobs.values()}
            counters = dict(self.dataplane.counters)
        counters.update(self.counters)
        return {"address": f"{self.address[0]}:{self.address[1]}", "counters": counters,
                "slots_total": self.table.total_slots, "slots_in_use": self.table.slots_in_use(),
                "jobs": jobs, "uptime_s": time.time() - self.started,
                "cpu_s": time.process_time(),
                "time_s": {k: round(v, 6) for k, v in self.timing.items()},
                "drop_rate": self.drop_rate}

    def run(self) -> None:
        threads = [threading.Thread(target=self.serve_control, daemon=True),
                   threading.Thread(target=self.janitor, daemon=True)]
        for t in threads:
            t.start()
        try:
            self.serve_packets()
        finally:
            self.stop()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.tcp.close()
        with contextlib.suppress(OSError):
            self.udp.close()
