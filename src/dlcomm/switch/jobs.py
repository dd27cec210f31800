"""Jobs on a switch: registration, slot ranges, keys (pure bookkeeping, no sockets).

A job registers with its number of workers and their UDP addresses and asks for a number
of slots (its window); it gets a job number, a random 64-bit key and a range of the switch's
slot pool to itself, so several jobs aggregate at once without touching each other's slots.
When the workers sit on distinct hosts and listen on a common port, the job also gets an IP
multicast group: the switch sends each result once and the network replicates it, as a
hardware switch replicates a result to the ports of a job (SwitchML).
Ending a job (or its timing out) returns its slots to the pool.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from dlcomm.errors import DlcommError

__all__ = ["Address", "Job", "JobTable", "SwitchFull", "MAX_WORKERS", "multicast_group"]

Address = tuple[str, int]
MAX_WORKERS = 4096


def multicast_group(job_id: int) -> str:
    """The administratively scoped group (239.77.0.0/16) that carries a job's results."""
    return f"239.77.{job_id >> 8 & 255}.{job_id & 255}"


class SwitchFull(DlcommError):
    """Not enough free slots (or job numbers) for a new job."""


@dataclass
class Job:
    job_id: int
    key: int
    addresses: tuple[Address, ...]   # rank -> UDP address; packets from elsewhere are dropped
    slot_base: int                   # first slot of the job's range in the pool
    slot_count: int
    k: int                           # elements per packet at most
    name: str = ""
    block: int = 0                   # sparse block size (0: dense rounds only); k % block == 0
    group: Address | None = None     # results go to this multicast group, else to every worker
    created: float = 0.0
    last_packet: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def workers(self) -> int:
        return len(self.addresses)


class JobTable:
    """The switch's jobs and its pool of ``total_slots`` slots (first-fit ranges)."""

    def __init__(self, total_slots: int, max_k: int) -> None:
        if total_slots < 1 or max_k < 1:
            raise ValueError("the switch needs at least one slot and k >= 1")
        self.total_slots = total_slots
        self.max_k = max_k
        self.jobs: dict[int, Job] = {}
        self._next_id = 1

    def slots_in_use(self) -> int:
        return sum(j.slot_count for j in self.jobs.values())

    def _free_range(self, count: int) -> int:
        taken = sorted((j.slot_base, j.slot_base + j.slot_count) for j in self.jobs.values())
        start = 0
        for lo, hi in taken:
            if lo - start >= count:
                return start
            start = max(start, hi)
        if self.total_slots - start >= count:
            return start
        raise SwitchFull(f"switch has {self.total_slots - self.slots_in_use()} free slots, "
                         f"{count} requested")

    def register(self, addresses: list[Address], slots: int, k: int, name: str = "",
                 now: float = 0.0, multicast_port: int | None = None, block: int = 0) -> Job:
        if not 1 <= len(addresses) <= MAX_WORKERS:
            raise ValueError(f"a job has 1..{MAX_WORKERS} workers, got {len(addresses)}")
        if len(set(addresses)) != len(addresses):
            raise ValueError("two workers registered the same address")
        if not 1 <= k <= self.max_k:
            raise ValueError(f"k must be in 1..{self.max_k}, got {k}")
        if slots < 1:
            raise ValueError(f"a job needs at least one slot, got {slots}")
        if block < 0 or (block and k % block):
            raise ValueError(f"the sparse block size {block} must divide k = {k}")
        base = self._free_range(slots)
        for _ in range(0xFFFF):
            job_id = self._next_id
            self._next_id = self._next_id % 0xFFFE + 1
            if job_id not in self.jobs:
                break
        else:
            raise SwitchFull("no free job number")
        group = None
        if multicast_port is not None:
            if not 0 < multicast_port < 65536:
                raise ValueError(f"bad multicast port {multicast_port}")
            group = (multicast_group(job_id), multicast_port)
        job = Job(job_id, secrets.randbits(64), tuple(addresses), base, slots, k, name, block,
                  group, now, now)
        self.jobs[job_id] = job
        return job

    def remove(self, job_id: int) -> Job | None:
        return self.jobs.pop(job_id, None)

    def idle(self, now: float, timeout_s: float) -> list[int]:
        """Jobs without a packet for ``timeout_s``."""
        return [j.job_id for j in self.jobs.values() if now - j.last_packet > timeout_s]
