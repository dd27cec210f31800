"""``ring``: torch.distributed's all-reduce (gloo on CPU), the baseline of every comparison.

Gloo runs large all-reduces as a chunked ring, so each worker sends and receives
2(n-1)/n of the tensor (docs/references.md: collective cost models). torch does not expose
its socket counters, so the byte counts are *modelled* from that formula and labelled so;
the emulated network adds true wire bytes from interface counters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dlcomm.errors import ConfigError
from dlcomm.exchange.base import (
    EXCHANGES,
    Capabilities,
    Exchange,
    ExchangeContext,
    completed_future,
)
from dlcomm.volume import ring_allreduce_bytes
from dlcomm.wire.sparse import Presence

__all__ = ["RingExchange"]


class RingExchange(Exchange):
    """All-reduce through torch.distributed on the context's process group."""

    name = "ring"
    capabilities = Capabilities(native_dtypes=True)

    def __init__(self, ctx: ExchangeContext) -> None:
        super().__init__(ctx, counting="modelled")

    def allreduce(self, flat: torch.Tensor, key: int | str | None = None,
                  presence: Presence | None = None) -> torch.futures.Future[torch.Tensor]:
        s = self._stats
        s.calls += 1
        s.elements += flat.numel()
        if self.ctx.world_size == 1:
            return completed_future(flat)
        moved = ring_allreduce_bytes(flat.numel() * flat.element_size(), self.ctx.world_size)
        s.bytes_sent += moved
        s.bytes_received += moved
        work = dist.all_reduce(flat, group=self.ctx.group, async_op=True)
        assert work is not None
        total: torch.futures.Future[torch.Tensor] = work.get_future().then(
            lambda fut: fut.value()[0])
        return total


@EXCHANGES.register("ring", "torch.distributed all-reduce (gloo ring), the baseline")
def _make_ring(ctx: ExchangeContext, **options: str) -> Exchange:
    if options:
        raise ConfigError(f"exchange 'ring' takes no options, got {sorted(options)}")
    return RingExchange(ctx)
