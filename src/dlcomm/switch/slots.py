"""The switch's per-job slot state: two copies per slot and their round arithmetic. Pure.

The rules that use them are in :mod:`dlcomm.switch.dataplane`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlcomm.switch.jobs import Job
from dlcomm.switch.planning import Plan
from dlcomm.wire.channel import frame_buffer
from dlcomm.wire.packet import Header
from dlcomm.wire.quant import EXP_ZERO

__all__ = ["SlotCopy", "Stream", "JobSlots", "SEQ_MASK", "popcount", "older", "next_of",
           "dense_values", "add_dense"]

SEQ_MASK = 0xFFFFFFFF


@dataclass(slots=True)
class SlotCopy:
    seq: int = -1
    remaining: int = 0
    expected: int = 0               # bitmap of the workers this round waits for
    bitmap: int = 0                 # bitmap of the workers that contributed
    exp: int = EXP_ZERO
    tsi: int = 0
    numel: int = 0
    acc: np.ndarray | None = None
    frame: memoryview | None = None   # the result datagram: header room, then acc's memory
    sparse: bool = False
    groups: np.ndarray | None = None  # sparse: this round's groups (sorted): rows of sums
    sums: np.ndarray | None = None   # sparse: int32 (planned blocks, b), in acc's memory
    union: np.ndarray | None = None  # sparse: bool (groups, m): the blocks planned
    rows: np.ndarray | None = None   # sparse: (groups, m) -> row of sums, -1 if not planned
    run: bool = False                # sparse: the result plans a dense run
    result: bytes = b""             # sparse: the encoded result payload
    started: float = 0.0            # when the round's first contribution arrived


def _copy(k: int) -> SlotCopy:
    """A slot copy whose accumulator lives in a result frame (sealed in place, no copy)."""
    frame, acc = frame_buffer(k)
    return SlotCopy(acc=acc, frame=memoryview(frame))


class Stream:
    """Per slot, the look-ahead of streaming aggregation: every worker's announced next
    non-zero groups (group, exponent, non-zero blocks), and the next round they imply."""

    __slots__ = ("looks", "pending_seq", "pending")

    def __init__(self, workers: int) -> None:
        self.looks: list[np.ndarray] = [np.zeros((0, 2), np.int64)] * workers
        self.pending_seq = -1        # the round whose groups are planned
        self.pending = Plan.nothing(0)


class JobSlots:
    """The slot copies of one job, allocated when the job registers."""

    __slots__ = ("job", "copies", "streams", "all")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.copies = [(_copy(job.k), _copy(job.k))
                       for _ in range(job.slot_count)]
        self.streams: list[Stream | None] = [None] * job.slot_count
        self.all = (1 << job.workers) - 1


def popcount(bits: int) -> int:
    return bin(bits).count("1")


def older(seq: int, current: int) -> bool:
    """``seq`` precedes the copy's ``current`` round (sequence numbers wrap at 2^32)."""
    return current >= 0 and 0 < (current - seq) & SEQ_MASK < 1 << 31


def next_of(current: int, seq: int) -> int:
    """The one sequence number that may start the copy's next round: two after the current
    one (rounds alternate between the two copies), or 0/1 for a copy not used yet."""
    if current < 0:
        return seq if seq < 2 else -1
    return (current + 2) & SEQ_MASK


def dense_values(payload: memoryview | bytes, limit: int) -> np.ndarray | None:
    """A dense payload's int32 values, or None if one lies beyond ``limit``."""
    values = np.frombuffer(payload, dtype=np.int32)
    if len(values) and (int(values.max()) > limit or int(values.min()) < -limit):
        return None
    return values


def add_dense(copy: SlotCopy, hdr: Header, values: np.ndarray) -> None:
    """Add a dense contribution's int32 values into the slot copy (the first one is copied)."""
    assert copy.acc is not None
    if copy.bitmap == 0:
        copy.acc[: hdr.numel] = values
    else:
        copy.acc[: hdr.numel] += values
    if hdr.exp > copy.exp:
        copy.exp = hdr.exp
