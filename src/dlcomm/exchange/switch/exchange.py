"""``switch``, ``sparse-switch``, ``auto``: all-reduce through dlcomm's aggregation switch.

The exchange is thin: :mod:`.spec` has parsed and checked its options, :mod:`.bootstrap`
joined the job on every shard, and the :class:`~.transport.Transport` runs each all-reduce
(:mod:`.window` and :mod:`.sparse_window` are the protocol, as pure state machines). Here:

1. ``auto`` chooses dense or sparse rounds per tensor, from the global block density its
   previous all-reduce showed (every worker saw the same sums, so every worker chooses
   alike);
2. after an op, that density is recorded, exactly, whichever client ran it (so that every
   worker chooses alike): a sparse op's union of blocks; a dense op's blocks of the sums
   that hold data, which the transport counts for auto (``Request.count``: the native
   client as the results come in, the Python client's op from the sums after it).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dlcomm.errors import ExchangeError
from dlcomm.exchange.base import (
    Capabilities,
    Exchange,
    ExchangeContext,
    ExchangeStats,
    completed_future,
)
from dlcomm.exchange.switch.bootstrap import Session, bootstrap
from dlcomm.exchange.switch.spec import SwitchSpec
from dlcomm.exchange.switch.transport import Finished, Request, Transport
from dlcomm.wire.sparse import Presence

__all__ = ["SwitchExchange", "auto_sparse_below"]


def auto_sparse_below(workers: int) -> float:
    """auto: sparse rounds while the global block density is below this. The crossover of
    the software switch measured on the emulated 1 Gbit/s star (docs/sparse.md, shared
    blocks: per-worker density = union density) falls with the number of workers, whose
    packets the switch handles one by one: near 35% union density at 4 workers (sparse
    1.49x at 25%, 0.68x at 50%) and 24% at 8 (0.98x at 25%); 0.7 / sqrt(n), between 15%
    and 50%, fits both."""
    return min(0.5, max(0.15, 0.7 / math.sqrt(max(workers, 1))))


class SwitchExchange(Exchange):
    """Sums through one or more aggregation switches; counts bytes on its own socket."""

    def __init__(self, ctx: ExchangeContext, spec: SwitchSpec) -> None:
        super().__init__(ctx, counting="measured")
        self.spec = spec
        self.name = spec.name
        self.capabilities = Capabilities(sparse=spec.mode != "dense")
        self.density: dict[int | str | None, float] = {}  # global block density per tensor
        self.sparse_ops = self.dense_ops = 0
        self.session: Session = bootstrap(ctx, spec)
        try:
            self.transport = Transport(self.session.sock, ctx.rank, ctx.world_size, spec.k,
                                       self.session.shards, spec.timing, spec.drop_rate,
                                       spec.seed, failure=self.session.failure,
                                       client=spec.client, results=self.session.results)
        except BaseException:
            self.session.close(leave=False)   # its sockets and control connections
            raise

    def _sparse_for(self, key: int | str | None) -> bool:
        mode = self.spec.mode
        return mode == "sparse" or (mode == "auto" and self.density.get(key, 0.0)
                                    < auto_sparse_below(self.ctx.world_size))

    def allreduce(self, flat: torch.Tensor, key: int | str | None = None,
                  presence: Presence | None = None) -> torch.futures.Future[torch.Tensor]:
        s = self._stats
        s.calls += 1
        s.elements += flat.numel()
        if flat.numel() == 0:
            return completed_future(flat)
        if flat.dtype != torch.float32:
            raise ExchangeError(f"the switch exchange sums float32 tensors, got {flat.dtype}")
        sparse = self._sparse_for(key)
        request = Request(flat, sparse, self.spec.block, self.spec.threshold,
                          presence if sparse else None,
                          count=self.spec.mode == "auto" and not sparse)
        return self.transport.submit(request).then(
            lambda fut: self._finished(key, fut.value()))

    def _finished(self, key: int | str | None, done: Finished) -> torch.Tensor:
        """Record the global block density of a finished op (step 2 of the module doc)."""
        if done.sparse:
            self.sparse_ops += 1
        else:
            self.dense_ops += 1
        if done.blocks:  # a sparse op's union, or a dense op's counted blocks (auto)
            self.density[key] = done.union_blocks / done.blocks
        return done.total

    def stats(self) -> ExchangeStats:
        t = self.transport.stats
        s = self._stats
        s.bytes_sent, s.bytes_received = t.bytes_sent, t.bytes_received
        extra: dict[str, Any] = {
            "packets_sent": t.packets_sent, "packets_received": t.packets_received,
            "retransmissions": t.retransmissions, "drops_injected": t.drops_injected,
            "refused": t.malformed,  # datagrams that did not verify: forged, replayed, broken
            "probes": t.extra.get("probes", 0), "prepare_s": t.extra.get("prepare_us", 0) / 1e6,
            "op_s": t.extra.get("op_us", 0) / 1e6, "k": self.spec.k, "window": self.spec.window,
            "shards": len(self.spec.addresses), "multicast": bool(self.session.groups),
            "mode": self.spec.mode, "sparse_ops": self.sparse_ops, "dense_ops": self.dense_ops}
        if self.spec.mode != "dense":
            extra["block_density"] = {str(k): v for k, v in self.density.items()}
        s.extra = extra
        return super().stats()

    def close(self) -> None:
        stopped = self.transport.close()
        self.session.close(leave=True, sockets=stopped)
