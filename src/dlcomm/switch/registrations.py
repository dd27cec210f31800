"""What the switch's control plane keeps per job and per connection, and its checks. Pure.

The rules are in :mod:`dlcomm.switch.control`: a registration holds one ticket and one
challenge nonce per rank and the members attached to it; a member is a connection
attached as one rank; a worker address is a unicast IPv4 literal and a port.
"""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import Job, JobTable, SwitchFull
from dlcomm.wire.control import BadRequest

__all__ = ["Limits", "SwitchState", "valid_worker_address", "Registration", "Member", "Conn",
           "RateLimit", "registration_stats"]


@dataclass(frozen=True)
class Limits:
    """What one switch grants (``dlcomm switch serve`` options)."""

    max_workers: int = 1024               # per job
    max_jobs: int = 256
    max_slots_per_job: int = 256
    registrations_per_minute: int = 60    # per source address
    max_connections: int = 1024
    max_connections_per_source: int = 64
    handshake_s: float = 10.0             # TLS handshake, then the first request
    idle_s: float = 60.0                  # an unattached connection without a request
    send_timeout_s: float = 5.0           # a member that does not read its events
    heartbeat_s: float = 10.0             # clients send one this often
    attach_s: float = 120.0               # a registration must go live within this


@dataclass
class SwitchState:
    """What the UDP loop and the control plane share (under ``lock``)."""

    table: JobTable
    dataplane: Dataplane
    lock: threading.Lock = field(default_factory=threading.Lock)
    counters: Counter[str] = field(default_factory=Counter)

    def add_job(self, job: Job) -> None:
        """Give the dataplane a job of the table, or take it from both (SwitchFull when its
        slots cannot be allocated): no half-made job keeps its slots."""
        try:
            self.dataplane.add_job(job)
        except Exception as exc:
            self.dataplane.remove_job(job.job_id)
            if isinstance(exc, MemoryError):
                raise SwitchFull(str(exc) or "no memory for the job's slots") from None
            raise


def valid_worker_address(pair: Any) -> tuple[str, int]:
    """A unicast IPv4 literal and a port 1..65535, or BadRequest."""
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise BadRequest("an address is [ip, port]")
    host, port = pair
    if not isinstance(host, str) or len(host) > 15:
        raise BadRequest("an address's host is an IPv4 literal")
    try:
        ip = ipaddress.IPv4Address(host)
    except ValueError:
        raise BadRequest(f"{host[:15]!r} is not an IPv4 literal") from None
    if ip.is_multicast or ip.is_unspecified or ip == ipaddress.IPv4Address("255.255.255.255") \
            or ip.is_reserved:
        raise BadRequest(f"{host} is not a unicast address")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise BadRequest("a port is an integer in 1..65535")
    return str(ip), port


@dataclass
class Registration:
    job: Job
    tickets: list[bytes]
    nonces: list[bytes]
    created: float
    attached: dict[int, Member] = field(default_factory=dict)
    challenged: dict[int, float] = field(default_factory=dict)
    last_control: float = 0.0
    ended: bool = False


class Member:
    """A connection attached to a registration as one rank."""

    def __init__(self, writer: asyncio.StreamWriter, reg: Registration, rank: int) -> None:
        self.writer, self.reg, self.rank = writer, reg, rank
        self.left = False
        self.last_heard = time.monotonic()


class Conn:
    def __init__(self, writer: asyncio.StreamWriter, source: str) -> None:
        self.writer, self.source = writer, source
        self.member: Member | None = None
        self.registered: list[Registration] = []


class RateLimit:
    """At most ``per_minute`` events per source in any 60 s."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.recent: dict[str, deque[float]] = {}

    def refuses(self, source: str, now: float) -> bool:
        """Whether an event from ``source`` now is one too many (if not, it is counted)."""
        times = self.recent.setdefault(source, deque())
        while times and now - times[0] > 60:
            times.popleft()
        if len(times) >= self.per_minute:
            return True
        times.append(now)
        if len(self.recent) > 4096:  # forget quiet sources
            for key in [k for k, v in self.recent.items() if not v]:
                del self.recent[key]
        return False


def registration_stats(registrations: dict[int, Registration],
                       connections: Counter[str]) -> dict[str, Any]:
    """The control plane's part of ``stats``: each registration's liveness and attached
    ranks, and the open connections."""
    # copies taken in one step each: a scrape runs on the exporter's thread while the
    # event loop's thread adds and removes entries
    return {"registrations": {str(j): {"live": r.job.live, "attached": sorted(r.attached)}
                              for j, r in list(registrations.items())},
            "connections": sum(list(connections.values()))}
