"""A DDP comm hook for every dlcomm exchange, compression optional.

:func:`hook` returns a ``(state, hook)`` pair for ``DistributedDataParallel.
register_comm_hook``: every gradient bucket goes through the named exchange (``ring``,
``switch``, ``sparse-switch``, ``auto``, ...), optionally compressed with error feedback
(docs/compression.md), and comes back averaged over the workers. Unlike the backend's
routing, the hook gives the exchange each bucket's index and parameter shapes, so PowerSGD
compresses matrix by matrix as torch's own ``powerSGD_hook`` does. A switch exchange with
no address gets a switch of its own, started by rank 0 and stopped by ``state.close()``.

Example (after ``torch.distributed.init_process_group(...)``, any backend)::

    import dlcomm.torch
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(net)
    state, hook = dlcomm.torch.hook("switch", compress="fp16")
    model.register_comm_hook(state, hook)
    ...                                      # train as usual
    print(state.exchange.stats().as_dict())  # bytes moved, methods, timing
    state.close()
"""

# No ``from __future__ import annotations``: DDP inspects the hook's annotations.

import torch.distributed as dist

from dlcomm.exchange.base import Exchange, ExchangeContext, make_exchange
from dlcomm.exchange.hook import ExchangeHookState, exchange_hook
from dlcomm.exchange.objects import GroupObjects
from dlcomm.registry import parse_spec
from dlcomm.torch.lifecycle import JobSwitch, join_or_start

__all__ = ["hook", "compression_hook", "HookState", "CompressionHookState",
           "compressed_bucket_hook"]


class HookState(ExchangeHookState):
    """The state of :func:`hook`: the exchange, step timing (the fields of
    :class:`~dlcomm.exchange.hook.ExchangeHookState`) and the job's switch if its own."""

    __slots__ = ("switch",)

    def __init__(self, exchange: "Exchange", world_size: int,
                 switch: "JobSwitch | None" = None) -> None:
        super().__init__(exchange, world_size)
        self.switch = switch

    def close(self) -> None:
        """Stop the exchange's thread, release the inner exchange, stop an own switch."""
        try:
            self.exchange.close()
        finally:
            if self.switch is not None:
                self.switch.close()
                self.switch = None


CompressionHookState = HookState  # the older name

# The exchange hook already hands an exchange with ``set_layout`` each bucket's parameter
# shapes (PowerSGD's matrices), records the step timing and divides the sum by the world
# size: a compressed exchange needs nothing else.
compressed_bucket_hook = exchange_hook


def hook(exchange: str = "switch", compress: "str | None" = None, memory: "str | None" = None,
         process_group: "dist.ProcessGroup | None" = None) -> "tuple[HookState, object]":
    """A ``(state, hook)`` pair for ``DistributedDataParallel.register_comm_hook``.

    Args:
        exchange: an exchange spec (``ring``; ``switch``; ``switch:addr=HOST:PORT,fp=...``;
            ``sparse-switch``; ``auto``; ``compressed:...``; ``dlcomm.exchange.EXCHANGES``).
        compress: a compressor spec (``fp16``, ``topk:ratio=0.01``, ``powersgd:rank=4``,
            ``adaptive``, ...), or None for the exchange's own sums.
        memory: error feedback (``none``, ``residual``, ``dgc``, ``powersgd``; default
            ``none``), with ``compress`` only.
        process_group: the group to reduce over (default: the default group).

    Returns:
        ``(state, hook)``; ``state.exchange.stats()`` reports bytes and methods,
        ``state.close()`` releases the exchange (and the job's own switch).
    """
    if not dist.is_initialized():
        raise RuntimeError("dlcomm.torch.hook needs torch.distributed to be initialized")
    if memory is not None and compress is None:
        raise ValueError("memory= is error feedback for compress=; name a compressor")
    rank = dist.get_rank(process_group)
    world = dist.get_world_size(process_group)
    ctx = ExchangeContext(rank, world, group=process_group)
    switch = join_or_start(parse_spec(exchange), GroupObjects(process_group, world), rank)
    try:
        built = make_exchange(switch.spec, ctx)
        if compress is not None:
            from dlcomm.exchange.compressed import compressed_exchange
            try:
                built = compressed_exchange(built, compress, memory or "none", ctx)
            except BaseException:
                built.close()
                raise
    except BaseException:
        switch.close()
        raise
    return HookState(built, world, switch), exchange_hook


def compression_hook(compress: str = "powersgd:rank=4", memory: str = "powersgd",
                     exchange: str = "ring", process_group: "dist.ProcessGroup | None" = None,
                     ) -> "tuple[HookState, object]":
    """:func:`hook` with compression first (the older entry): ``compression_hook(c, m, e)``
    is ``hook(e, compress=c, memory=m)``."""
    return hook(exchange, compress=compress, memory=memory, process_group=process_group)
