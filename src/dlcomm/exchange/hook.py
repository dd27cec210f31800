"""The DDP comm hook through which every exchange of dlcomm reaches PyTorch.

``DistributedDataParallel.register_comm_hook(state, exchange_hook)`` hands each gradient
bucket to ``state.exchange.allreduce``. DDP does not pre-divide gradients by the world
size, so the hook divides the sum to return the average, as torch's ``allreduce_hook`` does.
The state also records when buckets were handed over so the trainer can tell how long a
step waited on communication after its backward computation had finished.
"""

# No ``from __future__ import annotations`` here: DDP inspects the hook's annotations and
# wants the real GradBucket and Future types, not strings.
import time

import torch
from torch._C._distributed_c10d import GradBucket  # torch.distributed.GradBucket itself

from dlcomm.exchange.base import Exchange
from dlcomm.wire.sparse import presence

__all__ = ["ExchangeHookState", "exchange_hook"]


class ExchangeHookState:
    """Explicit state of :func:`exchange_hook`: the exchange and per-step timing."""

    __slots__ = ("exchange", "world_size", "buckets", "first_call", "last_call",
                 "blocks_nonzero", "blocks_total")

    DENSITY_BLOCK = 256  # block size of the reported gradient density (the sparse default)

    def __init__(self, exchange: "Exchange", world_size: int) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.exchange = exchange
        self.world_size = world_size
        self.reset_step()

    def reset_step(self) -> None:
        """Forget the timing of the previous step (call before each backward)."""
        self.buckets = 0
        self.first_call = 0.0
        self.last_call = 0.0
        self.blocks_nonzero = 0
        self.blocks_total = 0

    @property
    def block_density(self) -> float:
        """Fraction of this step's gradient blocks (of 256) that hold a non-zero value."""
        return self.blocks_nonzero / self.blocks_total if self.blocks_total else 0.0


def exchange_hook(state: ExchangeHookState,
                  bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one gradient bucket over all workers with ``state.exchange``.

    1. note the time the bucket was ready (backward has produced all its gradients), and how
       many of its blocks hold data (the density that sparse aggregation exploits; a sparse
       exchange is handed these blocks, so that nobody reads the bucket twice for them);
    2. start ``exchange.allreduce`` on the bucket's flat buffer (the sum over workers),
       after telling an exchange that wants it (``capabilities.layout``) the bucket's
       parameter shapes;
    3. divide the sum by the world size when it arrives; DDP copies it into ``.grad``.
    """
    now = time.perf_counter()
    if state.buckets == 0:
        state.first_call = now
    state.buckets += 1
    state.last_call = now
    seen = None
    if bucket.buffer().dtype == torch.float32:  # (dlcomm's gradients; others not counted)
        seen = presence(bucket.buffer().detach().numpy(), state.DENSITY_BLOCK)
        state.blocks_nonzero += int(seen.present.sum())
        state.blocks_total += len(seen.present)
    world = state.world_size
    if state.exchange.capabilities.layout:  # compressed: PowerSGD compresses matrix by matrix
        state.exchange.set_layout(bucket.index(), [g.shape for g in bucket.gradients()])
    if not state.exchange.capabilities.sparse:
        seen = None  # nothing to hand on: dense exchanges do not look at blocks
    fut = state.exchange.allreduce(bucket.buffer(), bucket.index(), seen)
    return fut.then(lambda done: done.value().div_(world))
