"""Prague's Group Generator: who averages models with whom (Luo et al., "Prague:
High-Performance Heterogeneity-Aware Asynchronous Decentralized Training", ASPLOS'20).
Pure: requests in, group assignments out; no sockets.

Prague's worker loop: compute a gradient and apply it locally, then ask the Group
Generator (GG) for a group and run a Partial All-Reduce (P-Reduce) with it: every member
replaces its model by the group's average. A worker may be named in a group before it asks
(random groups); such conflicts are serialised: every worker runs its groups in the order
the GG created them, so the oldest unfinished group can always proceed (no deadlock).

Generators (the ``generator=`` option):

- ``random``: the asking worker and ``group_size - 1`` others drawn uniformly at random,
  busy or not (Prague's baseline GG). A worker named in groups it did not ask for keeps
  them in its **group buffer** (a FIFO) and runs them one per ask before asking for new
  ones; a slow member makes the others of its groups wait.
- ``static``: a **static conflict-free schedule**: round r is a partition of the workers
  into groups, and a worker's r-th P-Reduce is with its round-r group. If n is a power of
  ``group_size`` the rounds cycle over the base-g digits (butterfly: after log_g n rounds
  every model has mixed with every other); otherwise the groups are consecutive blocks of
  the ranks rotated by ceil(g/2) per round.
- ``buffer``: heterogeneity-aware: the GG keeps a buffer of *ready* workers (those that have
  asked) and forms groups only from them, so nobody ever waits for a busy worker. As soon
  as ``group_size`` are ready it forms a group, preferring members whose previous groups
  differ (so the same workers do not keep averaging only among themselves); **group
  division**: when the oldest ready worker has waited ``window_ms`` the ready workers are
  divided into groups of at most ``group_size`` (two or more each) without waiting for
  the rest.

Ending: the first worker to finish its steps ends the run. From then on the GG creates no
new groups; a worker still receives the groups that were created with it (their other
members are, or will be, waiting in them), then a stop.

*Unverified:* the Prague paper (docs/references.md) names its Group Buffer and Group Division
but not their exact rules; the ``buffer`` generator and the static schedule above are our
reconstruction. Prague reports 1.2x over All-Reduce homogeneous and 4.4x heterogeneous.
"""

from __future__ import annotations

import abc
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dlcomm.errors import ConfigError
from dlcomm.registry import Registry

__all__ = ["Group", "Delivery", "GroupGenerator", "RandomGroups", "StaticSchedule",
           "GroupBuffer", "GENERATORS", "make_generator", "static_partition", "PragueSpec"]


@dataclass(frozen=True)
class PragueSpec:
    """The options of ``--sync prague:...``."""

    group_size: int = 4
    generator: str = "buffer"        # random | static | buffer
    impl: str = "dist"               # dist (gloo groups) | switch (a switch job per group)
    window_ms: float | None = None   # buffer's division window; None: adaptive


@dataclass(frozen=True)
class Group:
    """A P-Reduce: ``members`` (sorted ranks) average their models."""

    seq: int                    # creation order: each worker runs its groups by increasing seq
    members: tuple[int, ...]
    round: int = -1             # the static schedule's round (-1: not scheduled)


@dataclass(frozen=True)
class Delivery:
    """The GG's answer to worker ``rank``: a group to join, or None: stop."""

    rank: int
    group: Group | None


class GroupGenerator(abc.ABC):
    """Hands out groups to workers that ask (``ready``) and stops the run at its end."""

    name = "generator"

    def __init__(self, n: int, group_size: int, seed: int = 0) -> None:
        if n < 2:
            raise ConfigError(f"prague needs >= 2 workers, got {n}")
        if group_size < 2:
            raise ConfigError(f"prague: group_size must be >= 2, got {group_size}")
        self.n = n
        self.group_size = min(group_size, n)
        self.rng = random.Random(seed)
        self.stopped = False
        self.seq = 0
        self.groups_formed = 0
        self.size_counts: dict[int, int] = {}
        self.max_step_gap = 0                   # largest spread of members' steps in a group
        self._arrivals: dict[int, dict[int, int]] = {}
        self._sizes: dict[int, int] = {}
        self._steps_at_ask: dict[int, int] = {}

    @abc.abstractmethod
    def _ready(self, rank: int, now: float) -> list[Delivery]:
        """The deliveries caused by ``rank`` asking."""

    def ready(self, rank: int, now: float, steps: int = 0, final: bool = False) -> list[Delivery]:
        """Worker ``rank`` (having taken ``steps`` steps) asks for its next group.

        ``final``: it has taken all its steps; the run ends (no new groups from now on).
        Returns the answers to send now (to this worker and to others waiting)."""
        if not 0 <= rank < self.n:
            raise ValueError(f"rank {rank} outside 0..{self.n - 1}")
        if final:
            self.stopped = True
        self._steps_at_ask[rank] = steps
        return self._note(self._ready(rank, now))

    def tick(self, now: float) -> list[Delivery]:
        """Time-driven decisions (``buffer``'s window); call at ``next_deadline()``."""
        return self._note(self._tick(now))

    def _tick(self, now: float) -> list[Delivery]:
        return []

    def next_deadline(self) -> float | None:
        return None

    def _new_group(self, members: list[int], round_: int = -1) -> Group:
        group = Group(self.seq, tuple(sorted(members)), round_)
        self.seq += 1
        self.groups_formed += 1
        size = len(group.members)
        self.size_counts[size] = self.size_counts.get(size, 0) + 1
        self._sizes[group.seq] = size
        return group

    def _note(self, out: list[Delivery]) -> list[Delivery]:
        """Record each member's steps when it reaches a group, for the step-gap metric."""
        for d in out:
            if d.group is None:
                continue
            arrivals = self._arrivals.setdefault(d.group.seq, {})
            arrivals[d.rank] = self._steps_at_ask.get(d.rank, 0)
            if len(arrivals) == self._sizes[d.group.seq]:
                self.max_step_gap = max(self.max_step_gap,
                                        max(arrivals.values()) - min(arrivals.values()))
                del self._arrivals[d.group.seq]
        return out

    def stats(self) -> dict[str, object]:
        return {"generator": self.name, "groups": self.groups_formed,
                "group_sizes": {str(k): v for k, v in sorted(self.size_counts.items())},
                "max_step_gap_in_group": self.max_step_gap}


class _Queued(GroupGenerator):
    """Generators whose groups may name busy workers: per-worker FIFO group buffers."""

    def __init__(self, n: int, group_size: int, seed: int = 0) -> None:
        super().__init__(n, group_size, seed)
        self.queues: dict[int, deque[Group]] = {r: deque() for r in range(n)}

    def _assign(self, group: Group, asker: int) -> Delivery:
        for m in group.members:
            if m != asker:
                self.queues[m].append(group)
        return Delivery(asker, group)


@dataclass
class _Pending:
    rank: int
    since: float


class RandomGroups(_Queued):
    """The asker plus ``group_size - 1`` uniformly random others (busy or not)."""

    name = "random"

    def _ready(self, rank: int, now: float) -> list[Delivery]:
        if self.queues[rank]:
            return [Delivery(rank, self.queues[rank].popleft())]
        if self.stopped:
            return [Delivery(rank, None)]
        others = self.rng.sample([r for r in range(self.n) if r != rank], self.group_size - 1)
        return [self._assign(self._new_group([rank, *others]), rank)]


def static_partition(n: int, group_size: int, round_: int) -> list[tuple[int, ...]]:
    """Round ``round_`` of the static schedule: a partition of 0..n-1 into groups."""
    g = min(group_size, n)
    digits = round(math.log(n, g)) if g > 1 else 0
    if g > 1 and g ** digits == n and digits >= 1:
        d = round_ % digits          # butterfly: members differ only in base-g digit d
        stride = g ** d
        groups = []
        for base in range(n):
            if (base // stride) % g == 0:
                groups.append(tuple(base + i * stride for i in range(g)))
        return sorted(groups)
    shift = (round_ * -(-g // 2)) % n
    order = [(i + shift) % n for i in range(n)]
    blocks = [order[i:i + g] for i in range(0, n, g)]
    if len(blocks) > 1 and len(blocks[-1]) == 1:
        last = blocks.pop()
        blocks[-1] += last
    return sorted(tuple(sorted(b)) for b in blocks)


class StaticSchedule(GroupGenerator):
    """A worker's r-th P-Reduce is with its group in round r of a fixed partition cycle."""

    name = "static"

    def __init__(self, n: int, group_size: int, seed: int = 0) -> None:
        super().__init__(n, group_size, seed)
        self.rounds = [0] * n                                  # next round per worker
        self.created: dict[tuple[int, int], Group] = {}        # (round, index) -> group
        self.undelivered: dict[int, set[tuple[int, int]]] = {r: set() for r in range(n)}
        self._partitions: dict[int, list[tuple[int, ...]]] = {}

    def partition(self, round_: int) -> list[tuple[int, ...]]:
        if round_ not in self._partitions:
            self._partitions[round_] = static_partition(self.n, self.group_size, round_)
        return self._partitions[round_]

    def distinct_groups(self) -> list[tuple[int, ...]]:
        """Every group the schedule ever uses (its partitions repeat with period <= n)."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(2 * self.n):
            for members in static_partition(self.n, self.group_size, r):
                seen.setdefault(members, None)
        return list(seen)

    def _ready(self, rank: int, now: float) -> list[Delivery]:
        if not self.stopped:
            r = self.rounds[rank]
            index = next(i for i, g in enumerate(self.partition(r)) if rank in g)
            key = (r, index)
            if key not in self.created:
                self.created[key] = self._new_group(list(self.partition(r)[index]), r)
                for m in self.created[key].members:
                    if m != rank:
                        self.undelivered[m].add(key)
            else:
                self.undelivered[rank].discard(key)
            self.rounds[rank] = r + 1
            return [Delivery(rank, self.created[key])]
        # after the end: only the groups that others already wait in, in round order
        if self.undelivered[rank]:
            key = min(self.undelivered[rank])
            self.undelivered[rank].discard(key)
            self.rounds[rank] = key[0] + 1
            return [Delivery(rank, self.created[key])]
        return [Delivery(rank, None)]


class GroupBuffer(GroupGenerator):
    """Groups only of ready workers; group division after a window.

    ``window_s=None`` (adaptive): a third of the median over workers of how long they stay
    away between leaving the buffer and asking again (their step time; an exponential
    average per worker), 5 ms until measured; a slow worker does not stretch it, as the
    median follows the majority."""

    name = "buffer"
    WINDOW_FRACTION = 1 / 3
    INITIAL_WINDOW_S = 0.005

    def __init__(self, n: int, group_size: int, seed: int = 0,
                 window_s: float | None = None) -> None:
        super().__init__(n, group_size, seed)
        if window_s is not None and window_s < 0:
            raise ConfigError(f"prague: window_ms must be >= 0, got {window_s * 1e3:g}")
        self.fixed_window_s = window_s
        self.left_at: dict[int, float] = {}
        self.interval: dict[int, float] = {}
        self.waiting: list[_Pending] = []
        self.previous: dict[int, frozenset[int]] = {}
        self.divisions = 0                      # groups formed by division (window expired)

    def _ready(self, rank: int, now: float) -> list[Delivery]:
        if self.stopped:
            out = [Delivery(p.rank, None) for p in self.waiting] + [Delivery(rank, None)]
            self.waiting.clear()
            return out
        if rank in self.left_at:
            away = now - self.left_at[rank]
            old = self.interval.get(rank)
            self.interval[rank] = away if old is None else 0.7 * old + 0.3 * away
        self.waiting.append(_Pending(rank, now))
        return self._form(now)

    @property
    def window_s(self) -> float:
        if self.fixed_window_s is not None:
            return self.fixed_window_s
        if not self.interval:
            return self.INITIAL_WINDOW_S
        values = sorted(self.interval.values())
        return values[len(values) // 2] * self.WINDOW_FRACTION

    def _tick(self, now: float) -> list[Delivery]:
        return [] if self.stopped else self._form(now)

    def next_deadline(self) -> float | None:
        if len(self.waiting) < 2:
            return None
        return self.waiting[0].since + self.window_s

    def _form(self, now: float) -> list[Delivery]:
        out: list[Delivery] = []
        while len(self.waiting) >= self.group_size:
            members = self._pick(require_mixing=True)
            if members is None:
                break
            out += self._deliver(members, now)
        while len(self.waiting) >= 2 and now - self.waiting[0].since >= self.window_s:
            members = self._pick(require_mixing=False)
            assert members is not None
            self.divisions += 1
            out += self._deliver(members, now)
        return out

    def _pick(self, require_mixing: bool) -> list[int] | None:
        """The oldest ready worker and up to g-1 others, fresh partners first."""
        first = self.waiting[0].rank
        before = self.previous.get(first, frozenset())
        rest = [p.rank for p in self.waiting[1:]]
        fresh = [r for r in rest if r not in before]
        stale = [r for r in rest if r in before]
        self.rng.shuffle(fresh)
        self.rng.shuffle(stale)
        members = [first, *(fresh + stale)[:self.group_size - 1]]
        if require_mixing and len(members) < self.n and len(
                {self.previous.get(m) for m in members}) == 1 and first in self.previous:
            return None  # the same workers as last time while others exist: wait a little
        return members

    def _deliver(self, members: list[int], now: float) -> list[Delivery]:
        group = self._new_group(members)
        chosen = set(members)
        self.waiting = [p for p in self.waiting if p.rank not in chosen]
        for m in members:
            self.previous[m] = frozenset(members)
            self.left_at[m] = now
        return [Delivery(m, group) for m in group.members]

    def stats(self) -> dict[str, object]:
        return {**super().stats(), "divisions": self.divisions, "window_ms": self.window_s * 1e3}


GENERATORS: Registry[GroupGenerator] = Registry("prague generator")
GENERATORS.register("random", "asker + random others; conflicts queue in group buffers")(
    RandomGroups)
GENERATORS.register("static", "static conflict-free schedule of partitions")(StaticSchedule)
GENERATORS.register("buffer", "groups of ready workers; group division after a window")(
    GroupBuffer)


def make_generator(name: str, n: int, group_size: int, seed: int = 0,
                   window_s: float | None = None) -> GroupGenerator:
    factory: Callable[..., GroupGenerator] = GENERATORS.get(name)
    if factory is GroupBuffer:
        return GroupBuffer(n, group_size, seed, window_s)
    return factory(n, group_size, seed)
