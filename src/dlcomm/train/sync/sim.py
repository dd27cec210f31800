"""Discrete-event simulations of Hop and Prague over their pure state machines.

The same :class:`~dlcomm.train.sync.hop.HopWorker` and group generators that the process
layer drives are driven here by simulated compute times and message latencies (random,
per-channel FIFO like TCP), with no processes or tensors. The tests use them to check the
properties that must hold under any timing: Hop's iteration gap never exceeds ``max_gap``
between running neighbours, nobody deadlocks, every P-Reduce group is joined by all its
members in creation order. They also give the protocols' throughput under stragglers::

    r = simulate_hop(ring(8), HopOptions(max_gap=2, backup=1, skip=1), iterations=200,
                     compute_s=lambda rank, rng: 0.12 if rank == 3 else 0.03)
    r.steps, r.max_gap, r.deadlock
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field
from typing import Callable

from dlcomm.train.sync.graphs import Graph
from dlcomm.train.sync.hop import HopOptions, HopWorker
from dlcomm.train.sync.prague import GroupGenerator

__all__ = ["simulate_hop", "simulate_prague", "HopSimResult", "PragueSimResult"]

Compute = Callable[[int, random.Random], float]   # (rank, rng) -> seconds of one gradient
Latency = Callable[[random.Random], float]        # rng -> seconds of one message


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn))

    def run(self, max_events: int) -> int:
        n = 0
        while self._heap and n < max_events:
            self.now, _, fn = heapq.heappop(self._heap)
            fn()
            n += 1
        return n

    @property
    def idle(self) -> bool:
        return not self._heap


@dataclass
class HopSimResult:
    completed: list[int]          # iteration counters at the end (skips included)
    steps: list[int]              # gradients computed per worker
    finish_time: list[float]
    max_gap: int                  # largest true gap between running neighbours, ever
    violations: int               # times the gap exceeded max_gap (must be 0)
    deadlock: bool                # some worker never finished although nothing was in flight
    events: int
    skipped: list[int] = field(default_factory=list)


def simulate_hop(graph: Graph, options: HopOptions, iterations: int, compute_s: Compute,
                 latency_s: Latency = lambda rng: rng.uniform(1e-4, 2e-3), seed: int = 0,
                 max_events: int = 2_000_000) -> HopSimResult:
    """Run Hop on ``graph`` until the first worker completes ``iterations`` (and the rest
    stop at their next boundary), checking the true gap after every event."""
    rng = random.Random(seed)
    clock = _Clock()
    n = graph.n
    workers = [HopWorker[int](i, graph.in_neighbours(i), graph.out_neighbours(i), options)
               for i in range(n)]
    phase = ["start"] * n
    steps = [0] * n
    finish = [0.0] * n
    last_arrival: dict[tuple[int, int], float] = {}
    pairs = graph.undirected_pairs()
    worst = [0, 0]  # max gap, violations

    def check_gap() -> None:
        for a, b in pairs:
            if phase[a] != "done" and phase[b] != "done":
                gap = abs(workers[a].completed - workers[b].completed)
                worst[0] = max(worst[0], gap)
                worst[1] += gap > options.max_gap

    def send(src: int, dst: int, kind: str, value: int) -> None:
        t = max(clock.now + latency_s(rng), last_arrival.get((src, dst), 0.0) + 1e-9)
        last_arrival[(src, dst)] = t
        clock.at(t, lambda: deliver(dst, src, kind, value))

    def deliver(dst: int, src: int, kind: str, value: int) -> None:
        if phase[dst] == "done":
            return
        w = workers[dst]
        if kind == "token":
            w.on_token(src, value)
        elif kind == "update":
            w.on_update(src, value, value)
        else:
            w.on_finish(src, value)
        advance(dst)

    def computed(i: int) -> None:
        phase[i] = "wait"
        advance(i)

    def advance(i: int) -> None:
        w = workers[i]
        while True:
            if phase[i] == "start":
                start = w.try_start()
                if start is None:
                    return
                if start.skipped:
                    for j in w.neighbours:
                        send(i, j, "token", w.completed)
                for j in w.out_neighbours:
                    send(i, j, "update", start.iteration)
                phase[i] = "compute"
                clock.at(clock.now + compute_s(i, rng), lambda: computed(i))
                check_gap()
                return
            if phase[i] == "wait":
                if w.ready_updates() is None:
                    return
                c = w.complete()
                steps[i] += 1
                for j in w.neighbours:
                    send(i, j, "token", c)
                check_gap()
                if c >= iterations or w.stop_requested:
                    phase[i] = "done"
                    finish[i] = clock.now
                    for j in w.neighbours:
                        send(i, j, "finish", c)
                    return
                phase[i] = "start"
                continue
            return

    for i in range(n):
        clock.at(0.0, lambda i=i: advance(i))
    events = clock.run(max_events)
    return HopSimResult([w.completed for w in workers], steps, finish, worst[0], worst[1],
                        deadlock=clock.idle and any(p != "done" for p in phase),
                        events=events, skipped=[w.skipped_iterations for w in workers])


@dataclass
class PragueSimResult:
    steps: list[int]
    finish_time: list[float]
    groups: int
    deadlock: bool
    out_of_order: int             # groups a worker joined out of creation order (must be 0)
    double_booked: int            # times a worker was in two running groups (must be 0)
    events: int
    group_sizes: dict[int, int] = field(default_factory=dict)


def simulate_prague(generator: GroupGenerator, steps_per_worker: int, compute_s: Compute,
                    preduce_s: float = 0.002, rpc_s: Latency = lambda rng: rng.uniform(1e-4, 1e-3),
                    seed: int = 0, max_events: int = 2_000_000) -> PragueSimResult:
    """Run Prague's loop (compute, ask the GG, P-Reduce) until the first worker has taken
    ``steps_per_worker`` steps and every created group has been run."""
    rng = random.Random(seed)
    clock = _Clock()
    n = generator.n
    steps = [0] * n
    finish = [0.0] * n
    done = [False] * n
    in_group: list[int | None] = [None] * n
    last_seq = [-1] * n
    arrived: dict[int, set[int]] = {}
    counters = {"order": 0, "double": 0, "tick_at": None}

    def ask(i: int) -> None:
        final = steps[i] >= steps_per_worker
        clock.at(clock.now + rpc_s(rng),
                 lambda: dispatch(generator.ready(i, clock.now, steps[i], final)))

    def dispatch(deliveries: list) -> None:  # type: ignore[type-arg]
        for d in deliveries:
            clock.at(clock.now + rpc_s(rng), lambda d=d: receive(d.rank, d.group))
        deadline = generator.next_deadline()
        if deadline is not None and counters["tick_at"] != deadline:
            counters["tick_at"] = deadline
            clock.at(max(deadline, clock.now), lambda: dispatch(generator.tick(clock.now)))

    def receive(i: int, group) -> None:  # type: ignore[no-untyped-def]
        if group is None:
            done[i] = True
            finish[i] = clock.now
            return
        if in_group[i] is not None:
            counters["double"] += 1
        if group.seq < last_seq[i]:
            counters["order"] += 1
        last_seq[i] = group.seq
        in_group[i] = group.seq
        members = arrived.setdefault(group.seq, set())
        members.add(i)
        if len(members) == len(group.members):
            del arrived[group.seq]
            clock.at(clock.now + preduce_s, lambda: leave(group.members))

    def leave(members: tuple[int, ...]) -> None:
        for m in members:
            in_group[m] = None
            if steps[m] >= steps_per_worker:
                ask(m)  # drain the groups others wait in, then stop
            else:
                compute(m)

    def compute(i: int) -> None:
        def computed() -> None:
            steps[i] += 1
            ask(i)
        clock.at(clock.now + compute_s(i, rng), computed)

    for i in range(n):
        clock.at(0.0, lambda i=i: compute(i))
    events = clock.run(max_events)
    return PragueSimResult(steps, finish, generator.groups_formed,
                           deadlock=clock.idle and not all(done),
                           out_of_order=counters["order"], double_booked=counters["double"],
                           events=events, group_sizes=dict(generator.size_counts))
