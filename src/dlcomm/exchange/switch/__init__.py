"""``switch``: all-reduce through dlcomm's aggregation switch (SwitchML protocol).

Specs (every option optional)::

    switch:addr=HOST:PORT[+HOST:PORT...],k=15872,window=8,timeout_ms=200,deadline_s=30,
           drop=0,seed=0,multicast=auto|off
    sparse-switch:block=256,threshold=0,...   only the blocks that carry data (OmniReduce)
    auto:block=256,threshold=0,...            dense or sparse per tensor, from its density

``sparse-switch`` and ``auto`` use k = the largest multiple of the block size <= 16,000
(15,872 for 256), which is also the dense default, so that with threshold 0 all three give
bit-identical sums. Several addresses shard the job: chunks alternate over the
switches. When dlcomm starts the switch itself (``dlcomm train|bench --exchange switch``),
it fills in ``addr``; a running switch can also be named with ``--switch``.

Bootstrap (once per exchange):
1. the workers all-gather (over torch.distributed) the address each host uses to reach the
   switch; if every worker is on its own host (and ``multicast`` is not off), rank 0 picks a
   port that every worker binds on all its interfaces, so that results can come by IP
   multicast; otherwise (several workers on one host) each binds its own port and the switch
   sends results to every worker in turn;
2. the workers all-gather their UDP addresses;
3. rank 0 registers the job on every shard (its control connection stays open) and
   broadcasts the job numbers, keys and multicast groups; the other ranks attach; every
   worker joins the groups;
4. from then on gradients move only through the switch; a rank whose control connection
   drops makes the others fail at once, naming it.
"""

from __future__ import annotations

import math
import os
import random
import socket
from typing import Any

import torch
import torch.distributed as dist

from dlcomm.errors import ConfigError, ExchangeError
from dlcomm.exchange.base import EXCHANGES, Exchange, ExchangeContext, completed_future
from dlcomm.exchange.switch.control import ControlClient
from dlcomm.exchange.switch.sparse_window import SparseAllreduceOp
from dlcomm.exchange.switch.transport import Transport
from dlcomm.exchange.switch.window import Shard, Timing
from dlcomm.sockets import set_buffers
from dlcomm.wire.packet import max_elements
from dlcomm.wire.sparse import block_density

__all__ = ["SwitchExchange", "parse_addresses", "SWITCH_ENV", "auto_sparse_below"]

SWITCH_ENV = "DLCOMM_SWITCH"  # set by dlcomm's launchers when they start the switch
MAX_K = 16000  # 64,032-byte datagrams: near the UDP maximum, few per-packet costs
DEFAULT_BLOCK = 256
DEFAULT_K = MAX_K // DEFAULT_BLOCK * DEFAULT_BLOCK  # 15,872: dense chunks = sparse groups


def auto_sparse_below(workers: int) -> float:
    """auto: sparse rounds while the global block density is below this. The crossover of
    the software switch measured on the emulated 1 Gbit/s star (docs/sparse.md, shared
    blocks: per-worker density = union density) falls with the number of workers, whose
    packets the switch handles one by one: near 35% union density at 4 workers (sparse
    1.49x at 25%, 0.68x at 50%) and 24% at 8 (0.98x at 25%); 0.7 / sqrt(n), between 15%
    and 50%, fits both."""
    return min(0.5, max(0.15, 0.7 / math.sqrt(max(workers, 1))))


DENSITY_SAMPLE = 4096  # blocks auto looks at after a dense all-reduce (+-0.75% at 35%)
DEFAULT_WINDOW = 8  # per shard: enough to fill a link, small enough not to overflow queues

Address = tuple[str, int]


def parse_addresses(text: str) -> list[Address]:
    """``a:p+b:q`` (or ``a:p,b:q``) -> [(a, p), (b, q)]."""
    out = []
    for part in filter(None, (p.strip() for p in text.replace(",", "+").split("+"))):
        host, _, port = part.rpartition(":")
        try:
            out.append((host, int(port)))
        except ValueError:
            raise ConfigError(f"bad switch address {part!r} (expected HOST:PORT)") from None
        if not host or not 0 < out[-1][1] < 65536:
            raise ConfigError(f"bad switch address {part!r} (expected HOST:PORT)")
    if not out:
        raise ConfigError("the switch exchange needs addr=HOST:PORT (or --switch)")
    return out


def _local_address(switch: Address) -> str:
    """The address this host uses to reach ``switch`` (the emulated host sets it)."""
    if os.environ.get("DLCOMM_HOST_ADDR"):
        return os.environ["DLCOMM_HOST_ADDR"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(switch)
        return str(probe.getsockname()[0])


class SwitchExchange(Exchange):
    """Sums through one or more aggregation switches; counts bytes on its own socket."""

    name = "switch"

    def __init__(self, ctx: ExchangeContext, addresses: list[Address], k: int = DEFAULT_K,
                 window: int = DEFAULT_WINDOW, timing: Timing = Timing(), drop_rate: float = 0.0,
                 seed: int = 0, multicast: bool = True, mode: str = "dense",
                 block: int = 0, threshold: float = 0.0) -> None:
        super().__init__(ctx, counting="measured")
        if not 1 <= k <= max_elements():
            raise ConfigError(f"switch k must be in 1..{max_elements()}, got {k}")
        if window < 1:
            raise ConfigError(f"switch window must be >= 1, got {window}")
        if not 0 <= drop_rate < 1:
            raise ConfigError(f"switch drop rate must be in [0, 1), got {drop_rate}")
        if mode not in ("dense", "sparse", "auto"):
            raise ConfigError(f"switch mode must be dense, sparse or auto, got {mode!r}")
        if mode != "dense" and (block < 1 or k % block):
            raise ConfigError(f"sparse block size {block} must divide k = {k}")
        if threshold < 0:
            raise ConfigError(f"sparse threshold must be >= 0, got {threshold}")
        self.k, self.window, self.addresses = k, window, addresses
        self.mode, self.block, self.threshold = mode, block, threshold
        self.density: dict[int | str | None, float] = {}  # global block density per tensor
        self.sparse_ops = self.dense_ops = 0
        self.name = {"dense": "switch", "sparse": "sparse-switch", "auto": "auto"}[mode]
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.controls: list[ControlClient] = []
        self.multicast_port: int | None = None
        try:
            self._bind(ctx, _local_address(addresses[0]), multicast)
            shards = self._bootstrap(ctx, mode)
        except BaseException:
            self._close_sockets(leave=False)
            raise
        self.transport = Transport(self.sock, ctx.rank, ctx.world_size, k, shards, timing,
                                   drop_rate, seed, failure=self._failure)

    def _bind(self, ctx: ExchangeContext, host: str, multicast: bool) -> None:
        """Bind the data socket; one common port on every host if results can be multicast."""
        hosts: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(hosts, host, group=ctx.group)
        self.host = host
        if multicast and len(set(hosts)) == len(hosts) and not any(
                h.startswith("127.") for h in hosts):
            port = [random.randint(30000, 59999)]
            dist.broadcast_object_list(port, src=0, group=None)
            try:
                self.sock.setsockopt(socket.IPPROTO_IP, 49, 0)  # IP_MULTICAST_ALL: joined only
                self.sock.bind(("0.0.0.0", port[0]))
                ok = True
            except OSError:
                ok = False
            oks: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(oks, ok, group=ctx.group)
            if all(oks):
                self.multicast_port = port[0]
                set_buffers(self.sock)
                return
            self.sock.close()
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_buffers(self.sock)
        self.sock.bind((host, 0))

    def _bootstrap(self, ctx: ExchangeContext, mode: str = "dense") -> list[Shard]:
        mine = (self.host, int(self.sock.getsockname()[1]))
        everyone: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(everyone, mine, group=ctx.group)
        grants: list[Any] = [None]
        if ctx.rank == 0:
            try:
                granted = []
                for addr in self.addresses:
                    control = ControlClient(addr)
                    self.controls.append(control)
                    reply = control.request({"op": "register", "addresses": everyone,
                                             "slots": self.window, "k": self.k,
                                             "name": ctx.job_name,
                                             "multicast_port": self.multicast_port,
                                             "block": self.block if mode != "dense" else 0})
                    granted.append((reply["job"], reply["key"], reply["slots"],
                                    reply.get("group")))
                grants = [granted]
            except ExchangeError as exc:
                grants = [str(exc)]
        dist.broadcast_object_list(grants, src=0, group=None)
        if isinstance(grants[0], str):
            raise ExchangeError(grants[0])
        if ctx.rank != 0:
            for addr, (job, key, _, _) in zip(self.addresses, grants[0]):
                control = ControlClient(addr)
                self.controls.append(control)
                control.request({"op": "attach", "job": job, "key": key, "rank": ctx.rank})
        self.groups = sorted({g for *_, g in grants[0] if g})
        for group in self.groups:
            membership = socket.inet_aton(group) + socket.inet_aton(self.host)
            try:
                self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
            except OSError as exc:
                raise ExchangeError(f"cannot join multicast group {group} on {self.host}: "
                                    f"{exc.strerror or exc}") from exc
        return [Shard(addr, job, int(key, 16), slots)
                for addr, (job, key, slots, _) in zip(self.addresses, grants[0])]

    def _failure(self) -> str | None:
        return next((c.failure for c in self.controls if c.failure), None)

    def allreduce(self, flat: torch.Tensor, key: int | str | None = None
                  ) -> torch.futures.Future[torch.Tensor]:
        s = self._stats
        s.calls += 1
        s.elements += flat.numel()
        if flat.numel() == 0:
            return completed_future(flat)
        if flat.dtype != torch.float32:
            raise ExchangeError(f"the switch exchange sums float32 tensors, got {flat.dtype}")
        sparse = self.mode == "sparse" or (
            self.mode == "auto" and self.density.get(key, 0.0) < auto_sparse_below(
                self.ctx.world_size))
        transport = self.transport

        def make_op(data: Any) -> Any:
            op = transport.new_op(data, sparse, self.block, self.threshold)
            op.on_finish = lambda done: self._record_density(key, done)
            return op

        return transport.submit(flat, make_op)

    def _record_density(self, key: int | str | None, op: Any) -> None:
        """The global block density of a finished op (every worker sees the same results,
        so auto mode makes the same choice on every worker)."""
        if isinstance(op, SparseAllreduceOp):
            self.sparse_ops += 1
            total = max(len(op.mask), 1)
            self.density[key] = op.union_blocks / total
        else:
            self.dense_ops += 1
            if self.mode == "auto":  # a sample of about DENSITY_SAMPLE blocks, evenly spread
                # (an odd stride: no aliasing with power-of-two layouts); every worker holds
                # the same sums, so every worker gets the same answer
                every = max(1, len(op.out) // self.block // DENSITY_SAMPLE) | 1
                self.density[key] = block_density(op.out, self.block, every=every)

    def stats(self):  # type: ignore[no-untyped-def]
        t = self.transport.stats
        s = self._stats
        s.bytes_sent, s.bytes_received = t.bytes_sent, t.bytes_received
        s.extra = {"packets_sent": t.packets_sent, "packets_received": t.packets_received,
                   "retransmissions": t.retransmissions, "drops_injected": t.drops_injected,
                   "probes": t.extra.get("probes", 0),
                   "prepare_s": t.extra.get("prepare_us", 0) / 1e6,
                   "op_s": t.extra.get("op_us", 0) / 1e6,
                   "k": self.k, "window": self.window, "shards": len(self.addresses),
                   "multicast": bool(self.groups), "mode": self.mode,
                   "sparse_ops": self.sparse_ops, "dense_ops": self.dense_ops}
        if self.mode != "dense":
            s.extra["block_density"] = {str(k): v for k, v in self.density.items()}
        return super().stats()

    def _close_sockets(self, leave: bool) -> None:
        for control in self.controls:
            control.close(leave=leave)
        self.sock.close()

    def close(self) -> None:
        self.transport.close()
        self._close_sockets(leave=True)


def _opt(options: dict[str, str], key: str, convert: Any, default: Any) -> Any:
    if key not in options:
        return default
    try:
        return convert(options.pop(key))
    except ValueError:
        raise ConfigError(f"exchange 'switch': bad value for {key!r}") from None


def _make(ctx: ExchangeContext, mode: str, options: dict[str, str]) -> Exchange:
    name = {"dense": "switch", "sparse": "sparse-switch", "auto": "auto"}[mode]
    opts = dict(options)
    addr_text = opts.pop("addr", None) or os.environ.get(SWITCH_ENV)
    if not addr_text:
        raise ConfigError(f"exchange {name!r} needs addr=HOST:PORT (or let dlcomm start the "
                          f"switch: dlcomm train/bench --exchange {name})")
    timing = Timing(initial_timeout_s=_opt(opts, "timeout_ms", float, 200.0) / 1000,
                    deadline_s=_opt(opts, "deadline_s", float, 30.0))
    block = _opt(opts, "block", int, DEFAULT_BLOCK) if mode != "dense" else 0
    default_k = MAX_K // block * block if block else DEFAULT_K
    k = _opt(opts, "k", int, default_k)
    window = _opt(opts, "window", int, DEFAULT_WINDOW)
    drop = _opt(opts, "drop", float, 0.0)
    seed = _opt(opts, "seed", int, 0)
    threshold = _opt(opts, "threshold", float, 0.0) if mode != "dense" else 0.0
    multicast = opts.pop("multicast", "auto")
    if multicast not in ("auto", "off"):
        raise ConfigError(f"exchange {name!r}: multicast must be auto or off, got {multicast!r}")
    if mode != "dense" and not 32 <= block <= 1024:
        raise ConfigError(f"exchange {name!r}: block must be in 32..1024, got {block}")
    if opts:
        raise ConfigError(f"exchange {name!r} has no option(s) {sorted(opts)}")
    return SwitchExchange(ctx, parse_addresses(addr_text), k, window, timing, drop, seed,
                          multicast == "auto", mode, block, threshold)


@EXCHANGES.register("switch", "in-network aggregation through dlcomm's switch (SwitchML)")
def _make_switch(ctx: ExchangeContext, **options: str) -> Exchange:
    return _make(ctx, "dense", options)


@EXCHANGES.register("sparse-switch", "only non-zero blocks through the switch (OmniReduce)")
def _make_sparse(ctx: ExchangeContext, **options: str) -> Exchange:
    return _make(ctx, "sparse", options)


@EXCHANGES.register("auto", "dense or sparse switch rounds per tensor, from its density")
def _make_auto(ctx: ExchangeContext, **options: str) -> Exchange:
    return _make(ctx, "auto", options)
