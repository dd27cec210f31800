"""A switch exchange's bootstrap: sockets, the job on every shard, multicast groups.

Once per exchange, every collective within the exchange's own process group
(``ctx.group``, so that several groups, such as Prague's, bootstrap side by side):

1. the workers all-gather the address each host uses to reach the switch; if every worker
   is on its own host (and multicast is not off), rank 0 picks a port that every worker
   binds on all its interfaces, so that results can come by IP multicast; otherwise
   (several workers on one host) each binds its own port and the switch sends results to
   every worker in turn;
2. the workers all-gather their UDP addresses;
3. rank 0 registers the job on every shard (its control connection stays open) and
   broadcasts the job numbers, keys and multicast groups; the other ranks attach; every
   worker joins the groups.

A rank whose control connection drops later makes the others fail at once, naming it
(:meth:`Session.failure`).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from dlcomm.errors import ExchangeError
from dlcomm.exchange.base import ExchangeContext
from dlcomm.exchange.switch.spec import SwitchSpec
from dlcomm.exchange.switch.window import Shard
from dlcomm.runtime.placement import HOST_ADDR_ENV
from dlcomm.sockets import set_buffers
from dlcomm.switch.client import Address, ControlClient

__all__ = ["Session", "bootstrap", "local_address"]

IP_MULTICAST_ALL = 49  # Linux: 0 = deliver only the groups this socket joined


@dataclass
class Session:
    """A worker's part of one switch job: its data socket and control connections."""

    sock: socket.socket
    host: str
    controls: list[ControlClient] = field(default_factory=list)
    shards: list[Shard] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)  # multicast groups joined
    multicast_port: int | None = None

    def failure(self) -> str | None:
        """Why the job broke, as a control connection heard it (a worker left, ...)."""
        return next((c.failure for c in self.controls if c.failure), None)

    def close(self, leave: bool = True) -> None:
        """Leave the job on every shard (``leave``) and close every socket."""
        for control in self.controls:
            control.close(leave=leave)
        self.sock.close()


def local_address(switch: Address) -> str:
    """The address this host uses to reach ``switch`` (the emulated host sets it)."""
    if os.environ.get(HOST_ADDR_ENV):
        return os.environ[HOST_ADDR_ENV]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(switch)
        return str(probe.getsockname()[0])


def _all_gather(ctx: ExchangeContext, value: Any) -> list[Any]:
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, value, group=ctx.group)
    return out


def _broadcast_from_first(ctx: ExchangeContext, value: Any) -> Any:
    """``value`` of the group's first rank, on every rank of ``ctx.group``."""
    box = [value]
    dist.broadcast_object_list(box, group=ctx.group, group_src=0)
    return box[0]


def _bind(session: Session, ctx: ExchangeContext, multicast: bool) -> None:
    """Bind the data socket; one common port on every host if results can be multicast."""
    hosts = _all_gather(ctx, session.host)
    if multicast and len(set(hosts)) == len(hosts) and not any(
            h.startswith("127.") for h in hosts):
        port = _broadcast_from_first(ctx, random.randint(30000, 59999))
        try:
            session.sock.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
            session.sock.bind(("0.0.0.0", port))
            ok = True
        except OSError:
            ok = False
        if all(_all_gather(ctx, ok)):
            session.multicast_port = port
            set_buffers(session.sock)
            return
        session.sock.close()
        session.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    set_buffers(session.sock)
    session.sock.bind((session.host, 0))


def _register(session: Session, ctx: ExchangeContext, spec: SwitchSpec,
              everyone: list[Any]) -> list[Any] | str:
    """Rank 0: register the job on every shard; the grants, or the error as text."""
    try:
        granted = []
        for addr in spec.addresses:
            control = ControlClient(addr)
            session.controls.append(control)
            reply = control.request({"op": "register", "addresses": everyone,
                                     "slots": spec.window, "k": spec.k, "name": ctx.job_name,
                                     "multicast_port": session.multicast_port,
                                     "block": spec.block if spec.mode != "dense" else 0})
            granted.append((reply["job"], reply["key"], reply["slots"], reply.get("group")))
        return granted
    except ExchangeError as exc:
        return str(exc)


def _join(session: Session, grants: list[Any], ctx: ExchangeContext,
          spec: SwitchSpec) -> None:
    """The other ranks attach; every rank joins the job's multicast groups."""
    if ctx.rank != 0:
        for addr, (job, key, _, _) in zip(spec.addresses, grants):
            control = ControlClient(addr)
            session.controls.append(control)
            control.request({"op": "attach", "job": job, "key": key, "rank": ctx.rank})
    session.groups = sorted({g for *_, g in grants if g})
    for group in session.groups:
        membership = socket.inet_aton(group) + socket.inet_aton(session.host)
        try:
            session.sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        except OSError as exc:
            raise ExchangeError(f"cannot join multicast group {group} on {session.host}: "
                                f"{exc.strerror or exc}") from exc
    session.shards = [Shard(addr, job, int(key, 16), slots)
                      for addr, (job, key, slots, _) in zip(spec.addresses, grants)]


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
