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
from collections.abc import Callable
from dataclasses import dataclass, field

from dlcomm.train.sync.graphs import Graph
from dlcomm.train.sync.hop import HopOptions, HopWorker
from dlcomm.train.sync.prague import Delivery, GroupGenerator

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


class _HopSim:
    """Hop's workers on a simulated clock: messages with latencies, compute times."""

    def __init__(self, graph: Graph, options: HopOptions, iterations: int, compute_s: Compute,
                 latency_s: Latency, rng: random.Random) -> None:
        self.options, self.iterations = options, iterations
        self.compute_s, self.latency_s, self.rng = compute_s, latency_s, rng
        self.clock = _Clock()
        n = graph.n
        self.workers = [HopWorker[int](i, graph.in_neighbours(i), graph.out_neighbours(i),
                                       options) for i in range(n)]
        self.phase = ["start"] * n
        self.steps = [0] * n
        self.finish = [0.0] * n
        self.last_arrival: dict[tuple[int, int], float] = {}
        self.pairs = graph.undirected_pairs()
        self.worst = [0, 0]  # max gap, violations

    def check_gap(self) -> None:
        for a, b in self.pairs:
            if self.phase[a] != "done" and self.phase[b] != "done":
                gap = abs(self.workers[a].completed - self.workers[b].completed)
                self.worst[0] = max(self.worst[0], gap)
                self.worst[1] += gap > self.options.max_gap

    def send(self, src: int, dst: int, kind: str, value: int) -> None:
        clock = self.clock
        t = max(clock.now + self.latency_s(self.rng),
                self.last_arrival.get((src, dst), 0.0) + 1e-9)
        self.last_arrival[(src, dst)] = t
        clock.at(t, lambda: self.deliver(dst, src, kind, value))

    def deliver(self, dst: int, src: int, kind: str, value: int) -> None:
        if self.phase[dst] == "done":
            return
        w = self.workers[dst]
        if kind == "token":
            w.on_token(src, value)
        elif kind == "update":
            w.on_update(src, value, value)
        else:
            w.on_finish(src, value)
        self.advance(dst)

    def computed(self, i: int) -> None:
        self.phase[i] = "wait"
        self.advance(i)

    def _start(self, i: int) -> bool:
        """Start worker i's next iteration if its tokens allow; False: it waits."""
        w = self.workers[i]
        start = w.try_start()
        if start is None:
            return False
        if start.skipped:
            for j in w.neighbours:
                self.send(i, j, "token", w.completed)
        for j in w.out_neighbours:
            self.send(i, j, "update", start.iteration)
        self.phase[i] = "compute"
        self.clock.at(self.clock.now + self.compute_s(i, self.rng), lambda: self.computed(i))
        self.check_gap()
        return True

    def _complete(self, i: int) -> bool:
        """Finish worker i's iteration if its updates are in; True: it goes on."""
        w = self.workers[i]
        if w.ready_updates() is None:
            return False
        c = w.complete()
        self.steps[i] += 1
        for j in w.neighbours:
            self.send(i, j, "token", c)
        self.check_gap()
        if c >= self.iterations or w.stop_requested:
            self.phase[i] = "done"
            self.finish[i] = self.clock.now
            for j in w.neighbours:
                self.send(i, j, "finish", c)
            return False
        self.phase[i] = "start"
        return True

    def advance(self, i: int) -> None:
        if self.phase[i] == "start":
            self._start(i)
        elif self.phase[i] == "wait" and self._complete(i):
            self._start(i)


def simulate_hop(graph: Graph, options: HopOptions, iterations: int, compute_s: Compute,
                 latency_s: Latency = lambda rng: rng.uniform(1e-4, 2e-3), seed: int = 0,
                 max_events: int = 2_000_000) -> HopSimResult:
    """Run Hop on ``graph`` until the first worker completes ``iterations`` (and the rest
    stop at their next boundary), checking the true gap after every event."""
    sim = _HopSim(graph, options, iterations, compute_s, latency_s, random.Random(seed))
    for i in range(graph.n):
        sim.clock.at(0.0, lambda i=i: sim.advance(i))
    events = sim.clock.run(max_events)
    return HopSimResult([w.completed for w in sim.workers], sim.steps, sim.finish,
                        sim.worst[0], sim.worst[1],
                        deadlock=sim.clock.idle and any(p != "done" for p in sim.phase),
                        events=events, skipped=[w.skipped_iterations for w in sim.workers])


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

    def dispatch(deliveries: list[Delivery]) -> None:
        for d in deliveries:
            clock.at(clock.now + rpc_s(rng), lambda d=d: receive(d.rank, d.group))
        deadline = generator.next_deadline()
        if deadline is not None and counters["tick_at"] != deadline:
            counters["tick_at"] = deadline
            clock.at(max(deadline, clock.now), lambda: dispatch(generator.tick(clock.now)))

    def receive(i: int, group: tuple[int, ...] | None) -> None:
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
