"""Which compressor handles a call: the :class:`Policy` interface, the fixed policy of
``--compress METHOD``, and the :class:`CallRecord` of what each call cost (which the
adaptive policy learns from, :mod:`.adaptive`)."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from dlcomm.compress.base import Compressor

__all__ = ["Policy", "FixedPolicy", "CallRecord", "STABLE_ITERATION"]

STABLE_ITERATION = 2  # DDP rebuilds buckets after iteration 0: keyed state from here on


@dataclass
class CallRecord:
    """What one compressed all-reduce cost on this worker (for stats and the adaptive policy)."""

    name: str
    numel: int
    iteration: int
    method: str
    submitted: float = 0.0
    started: float = 0.0
    finished: float = 0.0
    comm_s: float = 0.0            # inside collectives
    memory_s: float = 0.0          # error feedback (the same for every method)
    wire_bytes: int = 0            # sent by this worker for this call
    collectives: list[tuple[int, float]] = field(default_factory=list)  # (bytes, seconds)

    @property
    def compute_s(self) -> float:
        """Compression and decompression: the rest of the call's time."""
        return max(0.0, self.finished - self.started - self.comm_s - self.memory_s)


class Policy(abc.ABC):
    """Which compressor handles a tensor; told what each call cost."""

    @abc.abstractmethod
    def choose(self, name: str, numel: int, iteration: int) -> Compressor:
        """The compressor for this call (the same on every worker)."""

    def observe(self, record: CallRecord) -> None:
        """Learn from a finished call."""

    def trials(self, name: str, numel: int, iteration: int) -> list[Compressor]:
        """Compressors to time once, on random data of this call's size, before the call
        (asked the same way on every worker, so every worker runs the same collectives)."""
        return []

    def timed(self, record: CallRecord) -> None:
        """What one of the trials cost."""

    @abc.abstractmethod
    def compressors(self) -> list[Compressor]:
        """Every compressor this policy may choose."""

    def stats(self) -> dict[str, Any]:
        return {}


class FixedPolicy(Policy):
    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor

    def choose(self, name: str, numel: int, iteration: int) -> Compressor:
        return self.compressor

    def compressors(self) -> list[Compressor]:
        return [self.compressor]
