"""A switch exchange's bootstrap: sockets, the job on every shard, multicast groups.

Once per exchange, every collective within the exchange's own process group
(``ctx.group``, so that several groups, such as Prague's, bootstrap side by side):

1. the workers all-gather the address each host uses to reach the switch; unless
   multicast is off, rank 0 picks a port for results to come to by IP multicast: if every
   worker is on its own host, every worker binds its one socket to that port on all its
   interfaces; if several share a host (loopback included), each keeps a socket of its own
   port for everything else and opens a second one on the common port for the job's
   results, so that a host takes one copy of each result whatever its workers (the switch
   declines the group where it could not reach them: workers on loopback addresses of a
   switch not bound to one); where that port cannot be bound everywhere, the switch sends
   results to every worker in turn;
2. the workers all-gather their UDP addresses;
3. rank 0 registers the job on every shard over TLS (the switch's pinned certificate; the
   admin token if the switch needs one) and broadcasts the job numbers, the per-rank
   tickets and multicast groups;
4. every rank asks every shard, over its own TLS connection from its own address, for a
   CHALLENGE nonce, which the switch sends to the rank's registered UDP address; then it
   attaches to every shard over its own TLS connection, from its registered
   address, with its ticket and the nonce its socket received; the switch answers with the
   job's secret, from which the rank derives its packet keys (wire/auth.py): the secret
   never travels in clear, and a host that only saw the tickets cannot attach;
5. every worker joins the job's multicast groups and waits until every shard says the job
   is live (every rank attached).

A rank whose control connection drops later makes the others fail at once, naming it
(:meth:`Session.failure`).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlcomm.errors import ExchangeError
from dlcomm.exchange.base import ExchangeContext, ObjectCollectives
from dlcomm.exchange.objects import GroupObjects
from dlcomm.exchange.switch.spec import SwitchSpec
from dlcomm.exchange.switch.window import Shard
from dlcomm.runtime.placement import HOST_ADDR_ENV
from dlcomm.sockets import set_buffers
from dlcomm.switch.client import Address, ControlClient
from dlcomm.switch.groups import is_loopback
from dlcomm.wire.auth import AUTH_MODES, JobKeys
from dlcomm.wire.channel import Channel
from dlcomm.wire.packet import (
    CHALLENGE,
    HEADER_SIZE,
    NONCE_SIZE,
    SWITCH_RANK,
    Malformed,
    decode_header,
)

__all__ = ["Session", "bootstrap", "local_address"]

IP_MULTICAST_ALL = 49  # Linux: 0 = deliver only the groups this socket joined
CHALLENGE_WAIT_S = 1.0  # then ask the switch to send it again
CHALLENGE_TRIES = 10


@dataclass
class Session:
    """A worker's part of one switch job: its data socket and control connections."""

    sock: socket.socket
    host: str
    controls: list[ControlClient] = field(default_factory=list)
    shards: list[Shard] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)  # multicast groups joined
    multicast_port: int | None = None
    # the socket results come to when several workers share this host (None: ``sock``)
    results: socket.socket | None = None

    def failure(self) -> str | None:
        """Why the job broke, as a control connection heard it (a worker left, ...)."""
        return next((c.failure for c in self.controls if c.failure), None)

    def close(self, leave: bool = True, sockets: bool = True) -> None:
        """Leave the job on every shard (``leave``) and close every socket (the data
        sockets only if ``sockets``: not while a thread that reads them still runs)."""
        for control in self.controls:
            control.close(leave=leave)
        if not sockets:
            return
        self.sock.close()
        if self.results is not None:
            self.results.close()


def local_address(switch: Address) -> str:
    """The address this host uses to reach ``switch`` (the emulated host sets it)."""
    if os.environ.get(HOST_ADDR_ENV):
        return os.environ[HOST_ADDR_ENV]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(switch)
        return str(probe.getsockname()[0])


def _objects(ctx: ExchangeContext) -> ObjectCollectives:
    return ctx.objects or GroupObjects(ctx.group, ctx.world_size)


def _all_gather(ctx: ExchangeContext, value: Any) -> list[Any]:
    return _objects(ctx).all_gather(value)


def _broadcast_from_first(ctx: ExchangeContext, value: Any) -> Any:
    """``value`` of the group's first rank, on every rank of the exchange's group."""
    return _objects(ctx).broadcast_from_first(value)


def _common_socket(port: int, shared: bool) -> socket.socket | None:
    """A socket on the job's common ``port`` on all interfaces, for the groups it joins
    only; None if the port is taken here. ``shared``: several workers of this host bind it
    side by side, for results only, with ``SO_REUSEPORT`` (each socket of the port still
    gets every group datagram), which lets only processes of the same user share the port:
    another user of the host cannot bind it and read the results."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
        set_buffers(sock)
        sock.bind(("0.0.0.0", port))
    except OSError:
        sock.close()
        return None
    return sock


def _bind(session: Session, ctx: ExchangeContext, multicast: bool) -> None:
    """Bind the data socket; one common port on every host if results can be multicast:
    the data socket's, or with several workers on a host (loopback included), a results
    socket's beside it. Workers on loopback addresses of hosts of their own get no group."""
    hosts = _all_gather(ctx, session.host)
    shared = len(set(hosts)) < len(hosts)
    if multicast and (shared or not any(is_loopback(h) for h in hosts)):
        port = _broadcast_from_first(ctx, random.randint(30000, 59999))
        common = _common_socket(port, shared)
        if all(_all_gather(ctx, common is not None)):
            assert common is not None
            session.multicast_port = port
            if not shared:  # the worker's own socket listens on the common port
                session.sock.close()
                session.sock = common
                return
            session.results = common
        elif common is not None:
            common.close()
    set_buffers(session.sock)
    session.sock.bind((session.host, 0))


def _token(spec: SwitchSpec) -> str | None:
    if not spec.token_file:
        return None
    try:
        return Path(spec.token_file).read_text().strip()
    except OSError as exc:
        raise ExchangeError(f"cannot read the switch's admin token {spec.token_file}: "
                            f"{exc.strerror or exc}") from exc


def _register(session: Session, ctx: ExchangeContext, spec: SwitchSpec,
              everyone: list[Any]) -> list[Any] | str:
    """Rank 0: register the job on every shard; the grants, or the error as text."""
    try:
        granted = []
        token = _token(spec)
        for addr, fp in zip(spec.addresses, spec.fingerprints):
            control = ControlClient(addr, fp)
            session.controls.append(control)
            reply = control.request({"op": "register", "addresses": everyone,
                                     "slots": spec.window, "k": spec.k, "name": ctx.job_name,
                                     "multicast_port": session.multicast_port,
                                     "block": spec.block if spec.mode != "dense" else 0,
                                     "auth": spec.auth, "token": token})
            granted.append((reply["job"], reply["tickets"], reply["slots"], reply.get("group")))
        return granted
    except ExchangeError as exc:
        return str(exc)


def _ask_challenges(session: Session, ctx: ExchangeContext, spec: SwitchSpec,
                    grants: list[Any], nonces: dict[Address, bytes]) -> None:
    """Ask every shard whose CHALLENGE has not arrived to send it (to this rank's address)."""
    for control, addr, (job, tickets, *_) in zip(session.controls, spec.addresses, grants):
        if addr not in nonces:
            with contextlib.suppress(ExchangeError):
                control.request({"op": "challenge", "job": job, "rank": ctx.rank,
                                 "ticket": tickets[ctx.rank]})


def _challenges(session: Session, ctx: ExchangeContext, spec: SwitchSpec,
                grants: list[Any]) -> list[bytes]:
    """The nonce every shard sent this rank's address when asked (asking again when one is
    lost)."""
    wanted = {addr: job for addr, (job, *_) in zip(spec.addresses, grants)}
    nonces: dict[Address, bytes] = {}
    sock = session.sock
    buf = bytearray(1 << 16)
    for _ in range(CHALLENGE_TRIES):
        _ask_challenges(session, ctx, spec, grants, nonces)
        deadline = time.monotonic() + CHALLENGE_WAIT_S
        while len(nonces) < len(wanted) and time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                n, src = sock.recvfrom_into(buf)
            except TimeoutError:
                continue
            try:
                hdr = decode_header(buf[:n])
            except Malformed:
                continue
            if hdr.type == CHALLENGE and wanted.get(src) == hdr.job and \
                    hdr.worker == SWITCH_RANK and hdr.seq == ctx.rank and \
                    n == HEADER_SIZE + NONCE_SIZE:
                nonces[src] = bytes(buf[HEADER_SIZE:n])
        if len(nonces) == len(wanted):
            break
    sock.settimeout(None)
    missing = [f"{h}:{p}" for h, p in wanted if (h, p) not in nonces]
    if missing:
        raise ExchangeError(f"rank {ctx.rank}: no CHALLENGE from the switch at "
                            f"{', '.join(missing)} reached {session.host}:"
                            f"{session.sock.getsockname()[1]} (a firewall, or the wrong "
                            "address?)")
    return [nonces[addr] for addr in spec.addresses]


def _join(session: Session, grants: list[Any], ctx: ExchangeContext,
          spec: SwitchSpec) -> None:
    """Attach to every shard (rank 0 on its registration connections); derive the keys;
    join the multicast groups; wait until the job is live."""
    if ctx.rank != 0:
        for addr, fp in zip(spec.addresses, spec.fingerprints):
            session.controls.append(ControlClient(addr, fp))
    nonces = _challenges(session, ctx, spec, grants)
    channels = []
    for control, (job, tickets, _, _), nonce in zip(session.controls, grants, nonces):
        reply = control.request({"op": "attach", "job": job, "rank": ctx.rank,
                                 "ticket": tickets[ctx.rank], "nonce": nonce.hex()})
        if reply.get("live"):
            control.live.set()
        keys = JobKeys.derive(bytes.fromhex(reply["secret"]), job, AUTH_MODES[spec.auth],
                              [ctx.rank])
        channels.append(Channel(keys, ctx.rank))
        control.start_heartbeats()
    session.groups = sorted({g for *_, g in grants if g})
    if not session.groups and session.results is not None:  # the switch declined a group
        session.results.close()
        session.results = None
    for group in session.groups:
        membership = socket.inet_aton(group) + socket.inet_aton(session.host)
        try:
            (session.results or session.sock).setsockopt(
                socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        except OSError as exc:
            raise ExchangeError(f"cannot join multicast group {group} on {session.host}: "
                                f"{exc.strerror or exc}") from exc
    session.shards = [Shard(addr, job, slots, channel) for addr, (job, _, slots, _), channel
                      in zip(spec.addresses, grants, channels)]
    deadline = time.monotonic() + spec.timing.deadline_s
    for control, addr in zip(session.controls, spec.addresses):
        if not control.live.wait(max(0.0, deadline - time.monotonic())):
            raise ExchangeError(control.failure or
                                f"the job did not go live on the switch at {addr[0]}:{addr[1]} "
                                f"within {spec.timing.deadline_s:g} s (a rank did not attach)")


def bootstrap(ctx: ExchangeContext, spec: SwitchSpec) -> Session:
    """Join (rank 0: register) the job on every switch of ``spec``; steps 1-3 above."""
    session = Session(socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
                      local_address(spec.addresses[0]))
    try:
        _bind(session, ctx, spec.multicast)
        everyone = _all_gather(ctx, (session.host, int(session.sock.getsockname()[1])))
        grants = _broadcast_from_first(ctx, _register(session, ctx, spec, everyone)
                                       if ctx.rank == 0 else None)
        if isinstance(grants, str):
            raise ExchangeError(grants)
        _join(session, grants, ctx, spec)
    except BaseException:
        with contextlib.suppress(OSError):
            session.close(leave=False)
        raise
    return session
