"""The two small interfaces of gradient compression: Compressor and Memory (GRACE, ICDCS'21).

A :class:`Compressor` turns a flat float32 tensor into a *payload* (a list of tensors) and a
*ctx* (what decompression needs that every worker knows anyway: sizes, shapes, shared random
indices), and back::

    payload, ctx = compressor.compress(tensor, name)
    approx = compressor.decompress(payload, ctx)          # same shape as tensor

Per-worker data (scales, norms) always travels inside the payload, never in ctx, so a peer's
payload decompresses with the local ctx. Flags say how payloads of several workers combine:

- ``summable``: payloads add element-wise and ``decompress(sum) == sum(decompress)``; they go
  through any exchange's all-reduce (:meth:`Compressor.rounds` says what travels);
- otherwise they are all-gathered and combined by ``aggregation``: ``"sum"`` of the
  decompressed tensors (accumulated in place, never n dense copies) or ``"majority"``, the
  sign of the sum of sign votes (signSGD with majority vote, Bernstein et al. ICLR'19);
- ``sparse``: the decompressed tensor is mostly zeros, so a sparse exchange can sum it.

A :class:`Memory` is error feedback: ``compensate`` adds what earlier steps did not send,
``update`` keeps the new remainder (docs/references.md: GRACE).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, TypeVar

import torch

from dlcomm.registry import Registry

__all__ = ["Compressor", "Memory", "Round", "Outcome", "Payload", "Protocol", "COMPRESSORS",
           "MEMORIES", "positive", "fraction", "count_of"]

Payload = list[torch.Tensor]
T = TypeVar("T")


@dataclass
class Round:
    """One collective a summable compressor asks for (sans-I/O: the exchange performs it).

    ``op="sum"``: every tensor is summed over workers. A tensor of an integer dtype holds
    integers in ``[-levels, levels]`` (the exchange packs several into one wire word); a
    float16/bfloat16 tensor may travel at that width where the exchange sums it natively.
    ``op="max"``: the element-wise maximum (a scale agreed before quantizing).
    """

    tensors: Payload
    op: str = "sum"
    levels: int | None = None
    inplace: bool = False  # the exchange may sum into these tensors (no copy)


@dataclass
class Outcome:
    """What a compressed exchange of one tensor produced on this worker."""

    total: torch.Tensor                   # the sum over workers of the decompressed tensors
    local: Callable[[], torch.Tensor] | None = None  # this worker's own decompressed part
    average: torch.Tensor | None = None   # the mean over workers, if computed exactly
    exact: bool = False                   # nothing was lost: error feedback has nothing to keep
    info: dict[str, Any] = field(default_factory=dict)


Protocol = Generator[Round, list[torch.Tensor], Outcome]


class Compressor(abc.ABC):
    """Compress a flat float32 tensor into a payload, and decompress it (GRACE's interface)."""

    name = "compressor"
    summable = False          # payloads add; all-reduce through any exchange
    aggregation = "sum"       # non-summable: "sum" of decompressed, or "majority" sign vote
    sparse = False            # decompressed tensors are mostly zeros
    fixed_size = False        # the payload's size depends only on the tensor's size
    lossless = False
    warmup_iterations = 0     # iterations that run uncompressed (and without error feedback)

    @abc.abstractmethod
    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        """Return the payload tensors and the context needed to decompress them."""

    @abc.abstractmethod
    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        """Rebuild a flat float32 tensor from ``payload`` (one worker's, or a sum)."""

    def decompress_add(self, payload: Payload, ctx: Any, out: torch.Tensor) -> None:
        """``out += decompress(payload, ctx)``; sparse methods override it to avoid a copy."""
        out += self.decompress(payload, ctx)

    def rounds(self, tensor: torch.Tensor, name: str, world: int,
               shapes: list[torch.Size] | None = None) -> Protocol:
        """The collectives of a summable compressor, as a generator (sans-I/O).

        Yields :class:`Round` requests, receives their results, returns an :class:`Outcome`.
        The default is one summed round of the payload; methods with an agreed scale or
        several rounds (PowerSGD) override it.
        """
        payload, ctx = self.compress(tensor, name)
        sums = yield Round(payload, "sum", self.payload_levels())
        return Outcome(self.decompress(sums, ctx), exact=self.lossless,
                       local=lambda: self.decompress(payload, ctx))

    def payload_levels(self) -> int | None:
        """For integer payloads: the largest |value| one worker sends."""
        return None

    def bind(self, rank: int, world: int) -> None:
        """Learn this worker's rank (methods with random rounding draw independently)."""

    def reset(self) -> None:
        """Forget state kept per tensor name (DDP rebuilt its buckets)."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "summable": self.summable, "aggregation": self.aggregation}


class Memory(abc.ABC):
    """Error feedback: what a worker did not send is added to its next gradient."""

    name = "memory"
    needs_local = True  # update() wants this worker's own decompressed contribution
    keeps = True        # update() remembers something (else the exchange skips it)

    @abc.abstractmethod
    def compensate(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """The tensor to compress: the gradient plus what is remembered (a new tensor)."""

    @abc.abstractmethod
    def update(self, compensated: torch.Tensor, name: str, local: torch.Tensor | None,
               average: torch.Tensor) -> None:
        """Remember what was not sent; ``local`` is this worker's decompressed
        contribution (None if the method has none), ``average`` the result over workers."""

    def forget(self, name: str) -> None:
        """Everything compensated for ``name`` was sent exactly: nothing remains."""

    def holds(self, name: str) -> bool:
        """Whether anything is remembered for ``name`` (if not, and the method is lossless,
        the exchange sends the gradient itself: no copy)."""
        return True

    def reset(self) -> None:
        """Forget everything (DDP rebuilt its buckets)."""


COMPRESSORS: Registry[Compressor] = Registry("compressor")
MEMORIES: Registry[Memory] = Registry("memory")


def count_of(ratio: float, n: int) -> int:
    """ceil(ratio x n), at least 1 and at most n, computed exactly on the ratio's decimal
    value: ``0.07`` of 100 elements is 7 (the float product 7.000000000000001 would round
    up to 8)."""
    exact = Fraction(repr(ratio)) * n
    return max(1, min(n, math.ceil(exact)))


def positive(x: float) -> bool:
    return x > 0


def fraction(x: float) -> bool:
    return 0 < x <= 1
