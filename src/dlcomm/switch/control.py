"""The switch's control plane: one asyncio event loop serving TLS connections.

What it guards against (docs/security.md): a connection is bounded in every way (a line of
at most 64 KiB, a TLS handshake and first request within :attr:`Limits.handshake_s`, an
unattached connection closed after :attr:`Limits.idle_s`, caps on connections in total and
per source, registrations per source per minute); an accept that fails (no file
descriptors) is logged and retried by the event loop, never fatal; every request's types
and ranges are checked and answered with one error line; events to a member that does not
read them are dropped after :attr:`Limits.send_timeout_s` (the janitor never blocks);
members belong to a registration, not to a job number, so a stale connection cannot end a
new job that got the same number.

A job's life: ``register`` (admin token where required; addresses must be unicast IPv4
literals) -> each rank asks for its ``challenge`` from its registered IP, and the switch
sends a CHALLENGE nonce to its registered address -> the rank ``attach``es from that IP
with its ticket and the nonce its address received (once per rank) -> live (packets are
accepted) -> heartbeats keep it; it ends when every rank left, when a rank's connection
drops (the others hear ``worker_left``, or ``job_failed`` if the job had failed), or when
both its packets and its heartbeats have been silent for the job timeout. A job gets the
multicast group it asks for only where the group reaches every worker (``groups.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import ssl
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from dlcomm.sockets import keepalive
from dlcomm.switch.groups import granted_port
from dlcomm.switch.jobs import SwitchFull
from dlcomm.switch.log import say_once
from dlcomm.switch.registrations import (
    Conn,
    Limits,
    Member,
    RateLimit,
    Registration,
    SwitchState,
    registration_stats,
    valid_worker_address,
)
from dlcomm.switch.security import token_matches
from dlcomm.wire.auth import AUTH_MODES, AUTH_NAMES
from dlcomm.wire.control import (
    MAX_LINE,
    BadRequest,
    decode_line,
    encode_line,
    take_hex,
    take_int,
    take_str,
)
from dlcomm.wire.packet import CHALLENGE, NONCE_SIZE, SWITCH_RANK, Header

__all__ = ["ControlPlane", "line_limit"]

TICKET_SIZE = 16
CHALLENGE_INTERVAL_S = 0.5


class ControlPlane:
    def __init__(self, state: SwitchState, send_udp: Callable[[bytes, tuple[str, int]], None],
                 token: str | None, limits: Limits, job_timeout_s: float,
                 stats: Callable[[], dict[str, Any]] | None = None,
                 loopback_multicast: bool = False) -> None:
        self.state, self.send_udp, self.token = state, send_udp, token
        self.loopback_multicast = loopback_multicast  # groups leave through lo (groups.py)
        self.stats = stats or self.stats_of_jobs
        self.limits, self.job_timeout_s = limits, job_timeout_s
        self.registrations: dict[int, Registration] = {}   # job number -> registration
        self.connections: Counter[str] = Counter()          # source -> open connections
        self.recent = RateLimit(limits.registrations_per_minute)  # registrations
        self.logged: set[str] = set()

    # -- logging and counting ------------------------------------------------------------
    def count(self, what: str) -> None:
        self.state.counters[f"control_{what}"] += 1

    def log_once(self, reason: str, detail: str) -> None:
        say_once(self.logged, f"control_{reason}", detail)

    # -- connections ---------------------------------------------------------------------
    async def connection(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        source = str(peer[0])
        limits = self.limits
        if sum(self.connections.values()) >= limits.max_connections or \
                self.connections[source] >= limits.max_connections_per_source:
            self.count("refused_connections")
            writer.close()
            return
        self.connections[source] += 1
        conn = Conn(writer, source)
        try:
            if (sock := writer.get_extra_info("socket")) is not None:
                keepalive(sock)  # a peer host that vanished is noticed
            await self._serve(reader, conn)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, ConnectionError):
            self.count("connection_errors")
        except asyncio.LimitOverrunError:
            self.count("line_too_long")
        except Exception as exc:  # noqa: BLE001 (a connection never takes the plane down)
            self.count("internal_errors")
            self.log_once("internal_errors", f"control connection failed: {exc!r}")
        finally:
            self.connections[source] -= 1
            if not self.connections[source]:
                del self.connections[source]
            self._closed(conn)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, conn: Conn) -> None:
        first = True
        while True:
            timeout = self.limits.handshake_s if first else (
                None if conn.member is not None else self.limits.idle_s)
            try:
                line = await asyncio.wait_for(reader.readuntil(b"\n"), timeout)
            except TimeoutError:
                self.count("idle_closed")
                return
            except asyncio.LimitOverrunError:
                self.count("line_too_long")
                await self._reply(conn.writer, {"ok": False, "error": "control line too long"})
                return
            except asyncio.IncompleteReadError:
                return
            first = False
            req: dict[str, Any] = {}
            try:
                req = decode_line(line)
                reply = self.handle(req, conn)
            except BadRequest as exc:
                self.count("bad_requests")
                reply = {"ok": False, "error": str(exc)}
            except SwitchFull as exc:
                reply = {"ok": False, "error": f"switch full: {exc}"}
            rid = req.get("id")
            if type(rid) is int:   # every reply, refusals too, answers its request's id
                reply["id"] = rid
            if not await self._reply(conn.writer, reply):
                return

    async def _reply(self, writer: asyncio.StreamWriter, obj: dict[str, Any]) -> bool:
        if writer.is_closing():
            return False
        try:
            writer.write(encode_line(obj))
            await asyncio.wait_for(writer.drain(), self.limits.send_timeout_s)
            return True
        except TimeoutError:
            self.count("slow_readers_dropped")
        except Exception:  # noqa: BLE001 (a reset peer; asyncio's TLS may raise anything)
            self.count("send_errors")
        writer.close()
        return False

    def _event(self, member: Member, obj: dict[str, Any]) -> None:
        """Send an event without waiting for it (a task that gives up after the timeout)."""
        asyncio.get_running_loop().create_task(self._reply(member.writer, obj))

    # -- requests --------------------------------------------------------------------------
    def handle(self, req: dict[str, Any], conn: Conn) -> dict[str, Any]:
        op = req.get("op")
        if op == "ping":
            from dlcomm import __version__
            return {"ok": True, "version": __version__}
        if op == "stats":
            self._admin(req)
            return {"ok": True, "stats": self.stats()}
        ops = {"register": self._register, "attach": self._attach,
               "challenge": self._challenge, "heartbeat": self._heartbeat, "leave": self._leave}
        if not isinstance(op, str) or op not in ops:
            raise BadRequest(f"unknown op {str(op)[:32]!r}")
        return ops[op](req, conn)

    def _admin(self, req: dict[str, Any]) -> None:
        if not token_matches(req.get("token"), self.token):
            self.count("bad_tokens")
            raise BadRequest("this switch requires its admin token")

    def _register(self, req: dict[str, Any], conn: Conn) -> dict[str, Any]:
        self._admin(req)
        now = time.monotonic()
        if conn.member is not None:
            raise BadRequest("this connection already belongs to a job")
        if self.recent.refuses(conn.source, now):
            self.count("registrations_limited")
            raise BadRequest("too many registrations from this address; try again later")
        limits = self.limits
        raw = req.get("addresses")
        if not isinstance(raw, list) or not 1 <= len(raw) <= limits.max_workers:
            raise BadRequest(f"addresses must list 1..{limits.max_workers} workers")
        addresses = [valid_worker_address(pair) for pair in raw]
        slots = take_int(req, "slots", 1, limits.max_slots_per_job)
        k = take_int(req, "k", 1, self.state.table.max_k)
        block = take_int(req, "block", 0, 1 << 16, default=0)
        mport = req.get("multicast_port")  # a group only where it reaches every worker
        multicast = None if mport is None else granted_port(
            take_int(req, "multicast_port", 1, 65535), addresses, self.loopback_multicast)
        name = take_str(req, "name", 64, default="")
        auth_name = take_str(req, "auth", 16, default="authenticated")
        if auth_name not in AUTH_MODES:
            raise BadRequest(f"auth must be one of {', '.join(AUTH_MODES)}")
        with self.state.lock:
            if len(self.state.table.jobs) >= limits.max_jobs:
                raise SwitchFull(f"{limits.max_jobs} jobs already")
            try:
                job = self.state.table.register(addresses, slots, k, name, now, multicast,
                                                block, AUTH_MODES[auth_name])
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            self.state.add_job(job)
        reg = Registration(job, [secrets.token_bytes(TICKET_SIZE) for _ in addresses],
                            [secrets.token_bytes(NONCE_SIZE) for _ in addresses], now,
                            last_control=now)
        self.registrations[job.job_id] = reg
        conn.registered.append(reg)
        self.count("registrations")
        return {"ok": True, "job": job.job_id, "tickets": [t.hex() for t in reg.tickets],
                "slots": job.slot_count, "k": job.k,
                "group": job.group[0] if job.group else None, "auth": auth_name}

    def _send_challenge(self, reg: Registration, rank: int, now: float) -> None:
        reg.challenged[rank] = now
        job = reg.job
        header = Header(CHALLENGE, job.job_id, SWITCH_RANK, 0, 0, rank, 0, 0)
        try:
            self.send_udp(header.pack() + reg.nonces[rank], job.addresses[rank])
            self.count("challenges_sent")
        except OSError:
            self.count("challenge_send_errors")

    def _registration(self, req: dict[str, Any]) -> tuple[Registration, int]:
        """The live registration and rank a request names, its ticket checked. Every field
        is checked before the job is looked up, and an unknown job, a rank beyond it and a
        wrong ticket get the same answer: nothing tells which job numbers are in use."""
        job_id = take_int(req, "job", 0, 0xFFFF)
        rank = take_int(req, "rank", 0, self.limits.max_workers - 1)
        ticket = take_hex(req, "ticket", TICKET_SIZE)
        reg = self.registrations.get(job_id)
        if reg is None or reg.ended or rank >= reg.job.workers or \
                not hmac.compare_digest(ticket, reg.tickets[rank]):
            if reg is not None:
                self.count("bad_tickets")
            raise BadRequest("no such job")
        return reg, rank

    def _challenge(self, req: dict[str, Any], conn: Conn) -> dict[str, Any]:
        """Send rank R's CHALLENGE to its registered address: asked for over a connection
        from that address's IP only, at most every CHALLENGE_INTERVAL_S, so the switch sends
        nothing to a host that did not ask (no reflection) and one datagram per request
        line, smaller than the line (no amplification)."""
        reg, rank = self._registration(req)
        now = time.monotonic()
        if conn.source != reg.job.addresses[rank][0]:
            self.count("challenge_wrong_source")
            raise BadRequest(f"rank {rank}'s challenge is asked for from "
                             f"{reg.job.addresses[rank][0]} only")
        if now - reg.challenged.get(rank, -1e9) < CHALLENGE_INTERVAL_S:
            self.count("challenges_limited")
            raise BadRequest(f"a challenge was sent less than {CHALLENGE_INTERVAL_S:g} s ago")
        self._send_challenge(reg, rank, now)
        return {"ok": True}

    def _attach(self, req: dict[str, Any], conn: Conn) -> dict[str, Any]:
        nonce = take_hex(req, "nonce", NONCE_SIZE)   # checked before the job is looked up
        reg, rank = self._registration(req)
        job = reg.job
        if conn.member is not None:
            raise BadRequest("this connection is attached already")
        if not hmac.compare_digest(nonce, reg.nonces[rank]):
            self.count("bad_nonces")
            raise BadRequest(f"rank {rank}: not the nonce sent to its address")
        if conn.source != job.addresses[rank][0]:
            self.count("attach_wrong_source")
            raise BadRequest(f"rank {rank} attaches from {job.addresses[rank][0]} only")
        if rank in reg.attached:
            self.count("attach_twice")
            raise BadRequest(f"rank {rank} is attached already")
        member = Member(conn.writer, reg, rank)
        reg.attached[rank] = member
        conn.member = member
        reg.last_control = time.monotonic()
        if len(reg.attached) == job.workers:
            with self.state.lock:
                job.live = True
                self.state.dataplane.job_live(job)
            for other in reg.attached.values():
                if other is not member:
                    self._event(other, {"event": "job_live", "job": job.job_id})
        return {"ok": True, "secret": job.secret.hex(), "live": job.live,
                "auth": AUTH_NAMES[job.auth]}

    def _heartbeat(self, req: dict[str, Any], conn: Conn) -> dict[str, Any]:
        if conn.member is None:
            raise BadRequest("this connection is not attached to a job")
        conn.member.last_heard = conn.member.reg.last_control = time.monotonic()
        return {"ok": True}

    def _leave(self, req: dict[str, Any], conn: Conn) -> dict[str, Any]:
        member = conn.member
        if member is None:
            raise BadRequest("this connection is not attached to a job")
        member.left = True
        reg = member.reg
        if all(m.left for m in reg.attached.values()) and \
                len(reg.attached) == reg.job.workers:
            self._end(reg, "left")
        return {"ok": True}

    # -- endings ---------------------------------------------------------------------------
    def _end(self, reg: Registration, why: str) -> None:
        if reg.ended:
            return
        reg.ended = True
        self.count(f"jobs_{why}")
        with self.state.lock:
            self.state.dataplane.remove_job(reg.job.job_id)
        if self.registrations.get(reg.job.job_id) is reg:
            del self.registrations[reg.job.job_id]

    def _closed(self, conn: Conn) -> None:
        member = conn.member
        if member is not None and not member.left and not member.reg.ended:
            reg = member.reg
            with self.state.lock:
                failure = reg.job.failure  # a rank that stops after the job failed
                waiting = self.state.dataplane.waiting(reg.job.job_id, time.monotonic())
            event: dict[str, Any] = {"event": "job_failed", "job": reg.job.job_id,
                                     "reason": failure} if failure else \
                {"event": "worker_left", "job": reg.job.job_id, "rank": member.rank}
            if waiting and not failure:   # e.g. a rank that gave up waiting for another
                event["waiting"] = {"ranks": waiting["ranks"], "since_s": waiting["since_s"]}
            self._end(reg, "failed")
            for other in reg.attached.values():
                if other is not member and not other.left:
                    self._event(other, event)
        for reg in conn.registered:  # a registration whose owner went before it was live
            if not reg.job.live and not reg.ended:
                self._end(reg, "abandoned")

    async def janitor(self, stop: asyncio.Event) -> None:
        """Every second: tell workers of failed jobs, free silent and abandoned jobs."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass
            self.sweep(time.monotonic())

    def tell_failures(self) -> None:
        """Every worker of a job the dataplane failed hears why (the packet loop calls this
        as soon as a job fails; the janitor every second)."""
        with self.state.lock:
            failures, self.state.dataplane.failures = self.state.dataplane.failures, []
        for job_id, reason in failures:
            reg = self.registrations.get(job_id)
            if reg is not None and not reg.ended:
                for member in reg.attached.values():
                    self._event(member, {"event": "job_failed", "job": job_id,
                                         "reason": reason})

    def sweep(self, now: float) -> None:
        self.tell_failures()
        silent_member = 3 * self.limits.heartbeat_s + 5
        for reg in list(self.registrations.values()):
            job = reg.job
            if not job.live:
                if now - reg.created > self.limits.attach_s:
                    self._end(reg, "not_attached")
                continue
            quiet = now - max(job.last_packet, reg.last_control)
            if quiet > self.job_timeout_s:
                for member in reg.attached.values():
                    self._event(member, {"event": "job_timeout", "job": job.job_id})
                self._end(reg, "timed_out")
                continue
            for member in reg.attached.values():
                if not member.left and now - member.last_heard > silent_member:
                    member.writer.close()  # its connection's end tells the others

    def stats_of_jobs(self) -> dict[str, Any]:  # statistics
        return registration_stats(self.registrations, self.connections)


def line_limit() -> int:
    """The StreamReader limit: a line longer than this is refused without being stored."""
    return MAX_LINE
