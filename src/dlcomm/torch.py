"""dlcomm's gradient compression for anyone's own DDP training script.

:func:`compression_hook` returns a ``(state, hook)`` pair for
``DistributedDataParallel.register_comm_hook``: every gradient bucket goes through
dlcomm's compressed exchange (docs/compression.md) over the chosen inner exchange, with
error feedback, and comes back averaged over the workers. Unlike the generic exchange hook
it passes the bucket's parameter shapes along, so PowerSGD compresses matrix by matrix
exactly as torch's own ``powerSGD_hook`` does.

Example (after ``torch.distributed.init_process_group("gloo")``)::

    import dlcomm.torch
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(net)
    state, hook = dlcomm.torch.compression_hook("powersgd:rank=4", memory="powersgd")
    model.register_comm_hook(state, hook)
    ...                                      # train as usual
    print(state.exchange.stats().as_dict())  # bytes moved, methods, timing
    state.close()
"""

# No ``from __future__ import annotations``: DDP inspects the hook's annotations.

import torch.distributed as dist

from dlcomm.exchange.base import ExchangeContext, make_exchange
from dlcomm.exchange.hook import ExchangeHookState, exchange_hook

__all__ = ["compression_hook", "CompressionHookState", "compressed_bucket_hook"]


class CompressionHookState(ExchangeHookState):
    """The state of :func:`compressed_bucket_hook`: a compressed exchange and step timing
    (the fields of :class:`~dlcomm.exchange.hook.ExchangeHookState`)."""

    __slots__ = ()

    def close(self) -> None:
        """Stop the exchange's thread and release the inner exchange."""
        self.exchange.close()


# The trainer's hook already hands an exchange with ``set_layout`` each bucket's parameter
# shapes (PowerSGD's matrices), records the step timing and divides the sum by the world
# size: the compressed exchange needs nothing else.
compressed_bucket_hook = exchange_hook


def compression_hook(compress: str = "powersgd:rank=4", memory: str = "powersgd",
                     exchange: str = "ring", process_group: "dist.ProcessGroup | None" = None,
                     ) -> "tuple[CompressionHookState, object]":
    """A ``(state, hook)`` pair for ``DistributedDataParallel.register_comm_hook``.

    Args:
        compress: a compressor spec (``fp16``, ``topk:ratio=0.01``, ``powersgd:rank=4``,
            ``adaptive``, ...; ``dlcomm.compress.COMPRESSORS``).
        memory: error feedback (``none``, ``residual``, ``dgc``, ``powersgd``).
        exchange: the inner exchange spec (``ring``; ``switch:addr=HOST:PORT``; ...).
        process_group: the group to reduce over (default: the default group).

    Returns:
        ``(state, hook)``; ``state.exchange.stats()`` reports bytes and methods,
        ``state.close()`` releases the exchange when training is over.
    """
    from dlcomm.exchange.compressed import compressed_exchange

    if not dist.is_initialized():
        raise RuntimeError("compression_hook needs torch.distributed to be initialized")
    rank = dist.get_rank(process_group)
    world = dist.get_world_size(process_group)
    ctx = ExchangeContext(rank, world, group=process_group)
    inner = make_exchange(exchange, ctx)
    try:
        wrapped = compressed_exchange(inner, compress, memory, ctx)
    except BaseException:
        inner.close()
        raise
    return CompressionHookState(wrapped, world), compressed_bucket_hook
