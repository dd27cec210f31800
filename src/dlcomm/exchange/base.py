"""The one gradient-exchange interface of dlcomm.

Everything that reduces gradients (torch's ring, the aggregation switch, sparse and
compressed variants, partial groups) implements :class:`Exchange`::

    fut = exchange.allreduce(flat, key)  # flat: 1-D float32, the same length on every worker
    total = fut.wait()               # the element-wise SUM over all workers

The trainer's DDP comm hook, the benchmarks and the emulator take any exchange by name from
:data:`EXCHANGES`. Each exchange counts the bytes it moves; ``counting`` says whether the
counts were measured on dlcomm's own sockets or modelled from the algorithm (torch's ring).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

from dlcomm.registry import Registry, Spec, parse_spec
from dlcomm.wire.sparse import Presence

__all__ = ["Exchange", "Capabilities", "ExchangeContext", "ExchangeStats", "EXCHANGES",
           "ObjectCollectives",
           "make_exchange", "completed_future"]


class ObjectCollectives(Protocol):
    """Small picklable values among a group's ranks, for an exchange's bootstrap."""

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""

    def broadcast_from_first(self, value: Any) -> Any:
        """The group's first rank's ``value``, on every rank."""


@dataclass(frozen=True)
class ExchangeContext:
    """Where an exchange runs: this worker's rank among ``world_size`` and its process group."""

    rank: int
    world_size: int
    group: dist.ProcessGroup | None = None  # None: the default group
    job_name: str = "dlcomm"  # names the job to services such as the switch
    # how the bootstrap swaps addresses and tickets: None = torch collectives on ``group``;
    # the dlcomm c10d backend, still being created, hands the job's store instead
    objects: ObjectCollectives | None = None


@dataclass
class ExchangeStats:
    """Traffic of one worker through an exchange, cumulative since it was created."""

    counting: str  # "measured" (our sockets) or "modelled" (from the algorithm)
    calls: int = 0
    elements: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"counting": self.counting, "calls": self.calls, "elements": self.elements,
                "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                **self.extra}


@dataclass(frozen=True)
class Capabilities:
    """What an exchange can do beyond summing float32 tensors: callers ask, never guess."""

    native_dtypes: bool = False  # sums float16, bfloat16 and int32 tensors as such (the ring)
    sparse: bool = False         # moves only the blocks that hold data (sparse-switch, auto)
    layout: bool = False         # wants each tensor's parameter shapes (:meth:`set_layout`)


class Exchange(abc.ABC):
    """Sums a flat tensor over all workers, asynchronously."""

    name: str = "exchange"
    capabilities: Capabilities = Capabilities()
    # calls per tensor that run otherwise than the rest (PowerSGD's uncompressed start): a
    # benchmark of the steady state warms up past them
    warmup_iterations: int = 0

    def __init__(self, ctx: ExchangeContext, counting: str) -> None:
        self.ctx = ctx
        self._stats = ExchangeStats(counting=counting)

    @abc.abstractmethod
    def allreduce(self, flat: torch.Tensor, key: int | str | None = None,
                  presence: Presence | None = None) -> torch.futures.Future[torch.Tensor]:
        """Start summing ``flat`` over all workers; the Future's value is the sum.

        The result may be written into ``flat`` itself; callers must not read ``flat``
        before the Future completes. ``key`` names the tensor (the DDP bucket index) for
        exchanges that keep state per tensor, such as error feedback in compression.
        ``presence``: which blocks of ``flat`` hold data, if the caller already looked (the
        DDP hook does, for its density metric); an exchange that needs them (sparse rounds)
        uses it instead of reading the tensor again, others ignore it.
        """

    def set_layout(self, key: int | str | None, shapes: list[torch.Size]) -> None:
        """The parameter shapes that make up the tensor named ``key`` (DDP's bucket), for
        exchanges whose ``capabilities.layout`` is set; others ignore it."""

    def stats(self) -> ExchangeStats:
        """Cumulative traffic of this worker (a snapshot copy)."""
        s = self._stats
        return ExchangeStats(s.counting, s.calls, s.elements, s.bytes_sent, s.bytes_received,
                             dict(s.extra))

    def close(self) -> None:
        """Release sockets and services; the exchange cannot be used afterwards."""

    def __enter__(self) -> Exchange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def completed_future(value: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A Future that already holds ``value`` (for one worker, nothing to exchange)."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(value)
    return fut


EXCHANGES: Registry[Exchange] = Registry("exchange")


def make_exchange(spec: str | Spec, ctx: ExchangeContext) -> Exchange:
    """Build the exchange named by ``spec`` (``name`` or ``name:key=value,...``)."""
    parsed = spec if isinstance(spec, Spec) else parse_spec(spec)
    factory: Callable[..., Exchange] = EXCHANGES.get(parsed.name)
    return factory(ctx, **parsed.options)
