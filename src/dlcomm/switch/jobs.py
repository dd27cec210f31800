"""Jobs on a switch: registration, slot ranges, secrets (pure bookkeeping, no sockets).

A job registers with its number of workers and their UDP addresses and asks for a number
of slots (its window); it gets a random job number, a random 32-byte secret (its packet keys derive
from it, wire/auth.py), and a range of the switch's slot pool to itself, so several jobs
aggregate at once without touching each other's slots. When the workers listen for results
on a common port and the group reaches every one of them (the control plane decides:
``groups.group_reaches``), the job also gets an IP multicast group, drawn at random from
239.0.0.0/8 (nobody can guess it from the job number): the switch sends each result once
and the network (or, for the workers of one host, its kernel) replicates it, as a hardware
switch replicates a result to the ports of a job (SwitchML). A job is *live* once every
rank has attached (and proved that its address receives); before that its packets are
dropped. Ending a job (or its timing out) returns its slots to the pool.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from dlcomm.errors import DlcommError
from dlcomm.wire.auth import AUTH_NAMES, SECRET_SIZE, JobKeys
from dlcomm.wire.channel import Channel
from dlcomm.wire.quant import value_limit

__all__ = ["Address", "Job", "JobTable", "SwitchFull", "MAX_WORKERS", "random_group"]

Address = tuple[str, int]
MAX_WORKERS = 4096
MAX_JOB_ID = 0xFFFE   # job numbers are 1..0xFFFE (a u16 in every packet)


def random_group(taken: set[str]) -> str:
    """An administratively scoped multicast group (239.0.0.0/8) no live job uses."""
    while True:
        group = f"239.{secrets.randbelow(256)}.{secrets.randbelow(256)}.{secrets.randbelow(256)}"
        if group not in taken and not group.endswith((".0", ".255")):
            return group


class SwitchFull(DlcommError):
    """Not enough free slots (or job numbers) for a new job."""


@dataclass
class Job:
    job_id: int
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
    secret: bytes = b""              # the packet keys derive from it (wire/auth.py)
    auth: int = 1                    # wire/auth.AUTH_*: none, authenticated, encrypted
    live: bool = False               # every rank attached and proved its address
    failure: str = ""                # why the job failed (its packets then get ERRORs)
    error_replies: dict[int, float] = field(default_factory=dict)  # rank -> last ERROR sent
    channel: Channel = field(init=False)
    limit: int = field(init=False)   # the largest |value| a worker may contribute

    def __post_init__(self) -> None:
        self.channel = Channel(JobKeys.derive(self.secret, self.job_id, self.auth,
                                              range(self.workers)), None)
        self.limit = value_limit(self.workers)

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
                 now: float = 0.0, multicast_port: int | None = None, block: int = 0,
                 auth: int = 1) -> Job:
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
        if auth not in AUTH_NAMES:
            raise ValueError(f"unknown authentication mode {auth}")
        base = self._free_range(slots)
        if len(self.jobs) >= MAX_JOB_ID:
            raise SwitchFull("no free job number")
        job_id = self.new_id()
        group = None
        if multicast_port is not None:
            if not 0 < multicast_port < 65536:
                raise ValueError(f"bad multicast port {multicast_port}")
            taken = {j.group[0] for j in self.jobs.values() if j.group}
            group = (random_group(taken), multicast_port)
        job = Job(job_id, tuple(addresses), base, slots, k, name, block, group, now, now,
                  secret=secrets.token_bytes(SECRET_SIZE), auth=auth)
        self.jobs[job_id] = job
        return job

    def new_id(self) -> int:
        """A random job number no live job has (numbers say nothing about other jobs)."""
        while True:
            job_id = 1 + secrets.randbelow(MAX_JOB_ID)
            if job_id not in self.jobs:
                return job_id

    def remove(self, job_id: int) -> Job | None:
        return self.jobs.pop(job_id, None)

    def idle(self, now: float, timeout_s: float) -> list[int]:
        """Jobs without a packet for ``timeout_s``."""
        return [j.job_id for j in self.jobs.values() if now - j.last_packet > timeout_s]
