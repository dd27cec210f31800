"""Event-driven schedule of one training iteration, on a fluid network.

Every pipeline stage stands for all its replicas (DP) and tensor-parallel ranks, which do
the same thing at the same time; so the simulation follows ``pp`` stage processes, not
thousands of ranks. Steps:

1. Each stage runs its operations in schedule order: 1F1B (PipeDream-Flush; Narayanan
   et al., SC'21: stage s does min(p-s-1, m) forwards, then alternates one forward and one
   backward, then drains the backwards) or GPipe (all forwards, then all backwards). A
   forward of micro-batch j waits for its activations from stage s-1, a backward for its
   gradient from stage s+1.
2. An operation is a list of segments: compute (a fixed time), then optionally a blocking
   collective (tensor-parallel all-reduces, MoE all-to-alls, embedding all-to-alls) that
   the stage waits for.
3. When a forward ends, its activations go to the next stage, when a backward ends its
   input gradient goes to the previous one (point-to-point calls, first in first out per
   link direction).
4. Data parallelism as DDP overlaps it: during the stage's last backward, a gradient
   bucket is ready when the compute of its last layer ends; buckets enter a FIFO queue
   per stage (and per gradient group), each all-reduce starting when the previous one
   ends and its bucket is ready, concurrently with the remaining compute.
5. The network is fluid: every collective in flight moves its bytes at the max-min fair
   rate of its pattern among all active ones (``dlcomm.plan.simulate.fluid.Sharing``);
   rates are recomputed whenever a transfer starts or ends. A call's fixed time and
   latencies are timers that do not use the network.
6. A stage is done when its last operation and its gradient queues are done; the
   iteration is the latest stage (the optimizer step is not modelled).

With uniform stages and no communication this gives (m + p - 1)(t_f + t_b), the bubble
(p-1)/(m+p-1) of GPipe and 1F1B (tested).

Interleaved 1F1B (Narayanan et al., SC'21, Sec. 2.2.2): each of the p devices holds v model
chunks, virtual stage c p + d on device d (the plans are given per virtual stage, v p of
them). Device d runs, as Megatron-LM does, ``(p - d - 1) 2 + (v - 1) p`` warm-up forwards
(at most m v; all of them when m = p), then alternates one forward and one backward,
then drains the backwards;
its k-th forward is micro-batch ``(k // (p v)) p + k % p`` of chunk ``(k // p) % v``, its
k-th backward the same micro-batch of chunk ``v - 1 - (k // p) % v`` (m must be a multiple
of p). A virtual stage waits for its input from virtual stage c p + d - 1 (the last device
hands chunk c's output to device 0's chunk c + 1), and its buckets are queued during its
own last backward. Without communication the bubble is (p - 1) / v of a micro-batch's
(t_f + t_b) at full-model size (tested).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.collective import Call
from dlcomm.plan.simulate.fluid import Sharing
from dlcomm.plan.simulate.orders import SCHEDULES, interleaved_order, stage_order

__all__ = ["Segment", "StagePlan", "StageTimes", "Timeline", "SCHEDULES", "stage_order",
           "interleaved_order", "simulate_schedule", "compute_only"]

@dataclass(frozen=True)
class Segment:
    compute_s: float = 0.0
    call: Call | None = None                 # blocking collective after the compute
    buckets: tuple[int, ...] = ()            # gradient buckets ready after the compute


@dataclass
class StagePlan:
    forward: list[Segment]                   # one micro-batch's forward
    backward: list[Segment]                  # one micro-batch's backward
    send_forward: Call | None = None         # activations to stage s+1, per micro-batch
    send_backward: Call | None = None        # input gradients to stage s-1
    buckets: list[Call] = field(default_factory=list)   # DP calls in bucket order


@dataclass
class StageTimes:
    stage: int
    end_s: float = 0.0
    compute_s: float = 0.0
    blocking_comm_s: dict[str, float] = field(default_factory=dict)
    last_backward_end_s: float = 0.0
    gradient_end_s: float = 0.0
    intervals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    @property
    def busy_comm_s(self) -> dict[str, float]:
        return {dim: _union(iv) for dim, iv in self.intervals.items()}

    def to_dict(self) -> dict[str, Any]:
        blocking = sum(self.blocking_comm_s.values())
        return {"stage": self.stage, "end_s": self.end_s, "compute_s": self.compute_s,
                "blocking_comm_s": dict(self.blocking_comm_s),
                "idle_s": max(self.last_backward_end_s - self.compute_s - blocking, 0.0),
                "gradient_tail_s": max(self.gradient_end_s - self.last_backward_end_s, 0.0),
                "comm_busy_s": self.busy_comm_s}


@dataclass
class Timeline:
    iteration_s: float
    stages: list[StageTimes]
    events: int
    rate_solves: int


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


class _Engine:
    """Timers and fluid transfers (module docstring, step 5)."""

    def __init__(self, sharing: Sharing) -> None:
        self.sharing = sharing
        self.now = 0.0
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.active: dict[int, list[Any]] = {}   # id -> [column, remaining, rate, done]
        self.counts: dict[int, int] = {}         # column -> transfers in flight
        self.dirty = False
        self.events = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn))

    def transfer(self, pattern: Hashable, nbytes: float, done: Callable[[], None]) -> None:
        self.seq += 1
        col = self.sharing.column[pattern]
        self.active[self.seq] = [col, nbytes, 0.0, done]
        self.counts[col] = self.counts.get(col, 0) + 1
        self.dirty = True

    def _rates(self) -> None:
        rates = self.sharing.rates_of(tuple(sorted(self.counts.items())))
        for t in self.active.values():
            t[2] = rates[t[0]]
        self.dirty = False

    def run(self) -> None:
        while self.heap or self.active:
            self.events += 1
            if self.dirty:
                self._rates()
            t_net = min((self.now + t[1] / t[2] for t in self.active.values()),
                        default=math.inf)
            t_ev = self.heap[0][0] if self.heap else math.inf
            t = min(t_net, t_ev)
            if not math.isfinite(t):
                raise RuntimeError("schedule deadlock: nothing left to happen")
            dt = t - self.now
            if dt > 0:
                for tr in self.active.values():
                    tr[1] -= tr[2] * dt
            self.now = max(self.now, t)
            if t_net <= t_ev:
                limit = 1e-9 * max(self.now, 1e-9)
                done = [k for k, tr in self.active.items() if tr[1] <= tr[2] * limit]
                for k in done:
                    col, _, _, callback = self.active.pop(k)
                    self.counts[col] -= 1
                    if not self.counts[col]:
                        del self.counts[col]
                    self.dirty = True
                    callback()
            else:
                _, _, fn = heapq.heappop(self.heap)
                fn()


def compute_only(stages: list[StagePlan]) -> list[StagePlan]:
    """The same stages without any communication: what the pipeline alone costs
    (compute plus bubble), the baseline that exposed communication is measured from."""
    def strip(segments: list[Segment]) -> list[Segment]:
        return [Segment(sum(seg.compute_s for seg in segments))]
    out = []
    for s, plan in enumerate(stages):
        none = Call("pp", s, "p2p", "none", 0.0, ())
        out.append(StagePlan(strip(plan.forward), strip(plan.backward),
                             none if s + 1 < len(stages) else None, none if s else None))
    return out


class _Calls:
    """The stages' collectives on the engine (module docstring, steps 2 to 5): a call's
    fixed time, then per step its latency and its fluid transfer; FIFO queues of calls."""

    def __init__(self, eng: _Engine, times: list[StageTimes]) -> None:
        self.eng = eng
        self.times = times
        self.queues: dict[Hashable, deque[Callable[[Callable[[], None]], None]]] = \
            defaultdict(deque)
        self.running: dict[Hashable, bool] = defaultdict(bool)

    def run(self, call: Call, stage: int, done: Callable[[], None]) -> None:
        """Run ``call`` now; record its busy interval on ``stage`` and then call ``done``."""
        eng = self.eng
        start = eng.now

        def finish() -> None:
            self.times[stage].intervals.setdefault(call.dim, []).append((start, eng.now))
            done()

        def step(i: int) -> None:
            if i == len(call.steps):
                finish()
                return
            st = call.steps[i]

            def send() -> None:
                if st.nbytes > 0:
                    eng.transfer(st.pattern, st.nbytes, lambda: step(i + 1))
                else:
                    step(i + 1)
            if st.latency_s > 0:
                eng.at(eng.now + st.latency_s, send)
            else:
                send()
        if call.fixed_s > 0:
            eng.at(eng.now + call.fixed_s, lambda: step(0))
        else:
            step(0)

    def enqueue(self, queue: Hashable, call: Call, stage: int,
                done: Callable[[], None]) -> None:
        """FIFO per queue: a call starts when the one before it has ended."""
        def go(next_one: Callable[[], None]) -> None:
            def finished() -> None:
                done()
                next_one()
            self.run(call, stage, finished)
        self.queues[queue].append(go)
        if not self.running[queue]:
            self._pump(queue)

    def _pump(self, queue: Hashable) -> None:
        """Start the next call of ``queue``, or mark the queue idle when it is empty."""
        if not self.queues[queue]:
            self.running[queue] = False
            return
        self.running[queue] = True
        self.queues[queue].popleft()(lambda: self._pump(queue))


class _Pipeline:
    """The stage processes (module docstring, steps 1 to 4 and 6): each device runs its
    operations in schedule order once their inputs have arrived, sends activations and
    gradients on, and queues a virtual stage's gradient buckets during that stage's last
    backward. ``stages`` are the plans per virtual stage, ``chunks`` per device."""

    def __init__(self, stages: list[StagePlan], micro: int, schedule: str, eng: _Engine,
                 times: list[StageTimes], chunks: int = 1, defer: bool = False) -> None:
        if chunks < 1 or len(stages) % chunks:
            raise ConfigError(f"{len(stages)} virtual stages do not split into {chunks} "
                              "model chunks per device")
        if chunks > 1 and schedule != "interleaved":
            raise ConfigError("model chunks need the interleaved schedule")
        self.stages = stages
        self.defer = defer   # every bucket of a device once its last operation ended
        self.virtual = len(stages)
        self.pp = self.virtual // chunks
        self.eng = eng
        self.times = times
        self.calls = _Calls(eng, times)
        if schedule == "interleaved":
            self.orders = [interleaved_order(self.pp, d, micro, chunks) for d in range(self.pp)]
        else:
            self.orders = [[(kind, j, 0) for kind, j in stage_order(schedule, self.pp, d, micro)]
                           for d in range(self.pp)]
        self.last_backward: dict[int, int] = {}   # virtual stage -> position of its last B
        for d, order in enumerate(self.orders):
            for pos, (kind, _, c) in enumerate(order):
                if kind == "B":
                    self.last_backward[c * self.pp + d] = pos
        self.arrived: list[set[tuple[str, int]]] = [set() for _ in range(self.virtual)]
        self.position = [0] * self.pp
        self.busy = [False] * self.pp

    def start(self) -> None:
        """Let every device start what it can."""
        for d in range(self.pp):
            self.try_start(d)

    def try_start(self, d: int) -> None:
        """Start device ``d``'s next operation if it is idle and the operation's input is in."""
        if self.busy[d] or self.position[d] >= len(self.orders[d]):
            return
        kind, j, c = self.orders[d][self.position[d]]
        v = c * self.pp + d
        if kind == "F" and v > 0 and ("act", j) not in self.arrived[v]:
            return
        if kind == "B" and v < self.virtual - 1 and ("grad", j) not in self.arrived[v]:
            return
        self.busy[d] = True
        final = kind == "B" and self.last_backward[v] == self.position[d] and not self.defer
        plan = self.stages[v]
        segments = plan.forward if kind == "F" else plan.backward
        self._run_segments(d, v, segments, 0, final, lambda: self._op_done(d, v, kind, j))

    def _run_segments(self, s: int, v: int, segments: list[Segment], i: int, final: bool,
                      done: Callable[[], None]) -> None:
        """Run ``segments[i:]`` of virtual stage ``v`` on device ``s`` (in the stage's
        ``final`` backward, queue the buckets each segment readies), then call ``done``."""
        if i == len(segments):
            done()
            return
        seg = segments[i]
        eng, times = self.eng, self.times

        def after_compute() -> None:
            if final:
                for b in seg.buckets:
                    call = self.stages[v].buckets[b]
                    self.calls.enqueue(("grad", s, call.dim), call, s,
                                       lambda: self._bucket_done(s))
            if seg.call is not None:
                t0 = eng.now

                def blocked() -> None:
                    dim = seg.call.dim if seg.call else ""
                    bc = times[s].blocking_comm_s
                    bc[dim] = bc.get(dim, 0.0) + eng.now - t0
                    self._run_segments(s, v, segments, i + 1, final, done)
                self.calls.run(seg.call, s, blocked)
            elif seg.compute_s > 0:
                self._run_segments(s, v, segments, i + 1, final, done)
            else:   # a timer of zero: runs of empty segments must not nest the stack
                eng.at(eng.now, lambda: self._run_segments(s, v, segments, i + 1, final, done))
        if seg.compute_s > 0:
            times[s].compute_s += seg.compute_s
            eng.at(eng.now + seg.compute_s, after_compute)
        else:
            after_compute()

    def _bucket_done(self, stage: int) -> None:
        """A gradient bucket of device ``stage`` has been all-reduced."""
        st = self.times[stage]
        st.gradient_end_s = max(st.gradient_end_s, self.eng.now)

    def _op_done(self, d: int, v: int, kind: str, j: int) -> None:
        """Operation (``kind``, ``j``) of virtual stage ``v`` on device ``d`` ended: send its
        output on, go on."""
        self.busy[d] = False
        self.position[d] += 1
        plan = self.stages[v]
        if self.defer and self.position[d] == len(self.orders[d]):
            for c in range(self.virtual // self.pp):
                for call in self.stages[c * self.pp + d].buckets:
                    self.calls.enqueue(("grad", d, call.dim), call, d,
                                       lambda: self._bucket_done(d))
        if kind == "F" and v + 1 < self.virtual:
            call = plan.send_forward
            assert call is not None
            self.calls.enqueue(("p2p", d, "F"), call, d,
                               lambda: self._deliver(v + 1, ("act", j)))
        if kind == "B":
            self.times[d].last_backward_end_s = self.eng.now
            if v > 0:
                call = plan.send_backward
                assert call is not None
                self.calls.enqueue(("p2p", d, "B"), call, d,
                                   lambda: self._deliver(v - 1, ("grad", j)))
        self.try_start(d)

    def _deliver(self, v: int, what: tuple[str, int]) -> None:
        """An input (activations or gradient of a micro-batch) reached virtual stage ``v``."""
        self.arrived[v].add(what)
        self.try_start(v % self.pp)

    def finish(self) -> None:
        """Check that every device ran all its operations; set when each device ended."""
        for s, st in enumerate(self.times):
            if self.position[s] != len(self.orders[s]):
                raise RuntimeError(f"stage {s} stopped after {self.position[s]} of "
                                   f"{len(self.orders[s])} operations")
            st.end_s = max(st.last_backward_end_s, st.gradient_end_s)


def simulate_schedule(stages: list[StagePlan], micro: int, sharing: Sharing,
                      schedule: str = "1f1b", chunks: int = 1, defer: bool = False) -> Timeline:
    """Run one iteration (module docstring) and return when everything ended; ``stages``
    are the plans per virtual stage, ``chunks`` of them per device (interleaved);
    ``defer``: gradients all-reduced after the device's last backward, not during it."""
    eng = _Engine(sharing)
    times = [StageTimes(s) for s in range(len(stages) // max(chunks, 1))]
    pipeline = _Pipeline(stages, micro, schedule, eng, times, chunks, defer)
    pipeline.start()
    eng.run()
    pipeline.finish()
    return Timeline(max(t.end_s for t in times), times, eng.events, sharing.solves)
