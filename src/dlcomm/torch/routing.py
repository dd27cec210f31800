"""Which all-reduces of the ``dlcomm`` backend go through the exchange (pure).

Only what the exchange sums as well as gloo does goes through it: one tensor, SUM or AVG,
a dtype of :attr:`BackendConfig.dtypes` (the switch adds 32-bit fixed point, so float64
stays with gloo unless asked for), at least ``min_bytes`` (below that one round trip
through the switch costs more than gloo's), on a group with an exchange. The decision
depends only on what every rank of a collective sees alike (op, dtype, size), so every
rank takes the same path, as torch's collectives require.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dlcomm.torch.config import BackendConfig

__all__ = ["Route", "route_allreduce", "EXCHANGE", "GLOO"]

EXCHANGE = "exchange"
GLOO = "gloo"
SUMMING = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)


@dataclass(frozen=True)
class Route:
    """Where one all-reduce goes and why (the reason is counted in the backend's stats)."""

    through: str      # EXCHANGE or GLOO
    reason: str


def route_allreduce(config: BackendConfig, has_exchange: bool, op: object,
                    tensors: list[torch.Tensor]) -> Route:
    """The path of ``all_reduce(tensors, op)`` on a group configured by ``config``."""
    if not has_exchange:
        return Route(GLOO, "no exchange" if config.uses_exchange else "exchange ring")
    if len(tensors) != 1:
        return Route(GLOO, "several tensors")
    if not any(op == o for o in SUMMING):
        return Route(GLOO, "reduce op")
    tensor = tensors[0]
    if tensor.dtype not in config.dtypes:
        return Route(GLOO, "dtype")
    if tensor.device.type != "cpu" or tensor.is_sparse:
        return Route(GLOO, "layout")
    if tensor.numel() * tensor.element_size() < max(config.min_bytes, 1):
        return Route(GLOO, "small")
    return Route(EXCHANGE, "exchange")
