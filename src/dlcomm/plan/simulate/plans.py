"""Stage plans of one iteration: what each pipeline stage of a catalog workload computes,
waits for and sends (steps 2 to 6 of :mod:`dlcomm.plan.simulate.iteration`, which describes
them in full).

Per stage: the blocking tensor-parallel, MoE and embedding calls inside compute; the DDP
gradient buckets in backward order, per gradient group; the pipeline transfers to the
neighbouring stages. Compute is merged between these events into segments
(:class:`dlcomm.plan.simulate.schedule.Segment`), what the schedule runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlcomm.plan.simulate.collective import Call, Collectives
from dlcomm.plan.simulate.fluid import SimNetwork
from dlcomm.plan.simulate.schedule import (
    Segment,
    StagePlan,
    Timeline,
    compute_only,
    simulate_schedule,
)
from dlcomm.plan.traffic import Parallelism, _is_mlp, _pairs, stages, vocab_parallel
from dlcomm.workloads.catalog import ModelTable, gradient_buckets

__all__ = ["StagePlanner", "run_plans"]

_SPLIT = ("linear", "conv", "embedding")   # layer kinds whose parameters TP splits


@dataclass
class StagePlanner:
    """Stage plans of one iteration (module docstring); ``calls`` collects every call made."""

    model: ModelTable
    par: Parallelism
    coll: Collectives
    fwd: list[float]                       # per layer, per micro-batch and rank (s)
    bwd: list[float]
    sharded_embeddings: bool
    cap_bytes: int
    calls: list[Call] = field(default_factory=list)
    # layer index ranges [start, end) per virtual stage (default: ``traffic.stages``, one per
    # pipeline stage); virtual stage v runs on pipeline stage v % pp (interleaved chunks)
    parts: list[tuple[int, int]] | None = None
    recompute: bool = False   # backward re-runs the forward's blocking calls (``bwd`` holds
    # the forward's compute already: activation recomputation)

    def plans(self) -> list[StagePlan]:
        """One plan per virtual stage, in order (one per pipeline stage unless ``parts``)."""
        parts = self.parts
        if parts is None:
            bounds = np.cumsum([0] + [len(p) for p in stages(self.model, self.par.pp)])
            parts = [(int(a), int(b)) for a, b in zip(bounds, bounds[1:])]
        last = len(parts) - 1
        return [self._stage(v % self.par.pp, a, b, v < last, v > 0)
                for v, (a, b) in enumerate(parts)]

    def _stage(self, s: int, start: int, end: int, has_next: bool | None = None,
               has_prev: bool | None = None) -> StagePlan:
        """The plan of stage ``s``, layers ``start`` to ``end - 1`` (steps 2 to 6)."""
        par, layers, mb = self.par, self.model.layers, self.par.batch / self.par.micro_batches
        nb = par.bytes
        pre_f: dict[int, list[Call]] = {}
        post_f: dict[int, list[Call]] = {}
        pre_b: dict[int, list[Call]] = {}
        post_b: dict[int, list[Call]] = {}

        def add(where: dict[int, list[Call]], i: int, call: Call) -> None:
            where.setdefault(i, []).append(call)
            self.calls.append(call)

        pairs = _pairs(layers)
        if par.tp > 1:
            for a, b in pairs:
                if not start <= a < end:
                    continue
                last = a if b is None else b
                at = last if last < end else end - 1
                add(post_f, at, self.coll.allreduce("tp", s, layers[last].out_elems * mb * nb))
                if self.recompute:
                    add(pre_b, at, self.coll.allreduce("tp", s,
                                                       layers[last].out_elems * mb * nb))
                add(post_b, a, self.coll.allreduce("tp", s, layers[a].in_elems * mb * nb))
            for i in range(start, end):
                if vocab_parallel(layers[i]) and not self.sharded_embeddings:
                    add(post_f, i, self.coll.allreduce("tp", s, layers[i].out_elems * mb * nb))
        experts: set[int] = set()
        if par.ep > 1:
            mlp = [p for p in pairs if p[1] is not None and _is_mlp(layers[p[0]])]
            for a, b in mlp[par.moe_every - 1::par.moe_every]:
                assert b is not None
                if not start <= a < end:
                    continue
                experts |= {a, b}
                dispatch = layers[a].in_elems * mb * nb / par.tp
                combine = layers[b].out_elems * mb * nb / par.tp
                add(pre_f, a, self.coll.alltoall("ep", s, dispatch))
                add(post_f, min(b, end - 1), self.coll.alltoall("ep", s, combine))
                add(pre_b, min(b, end - 1), self.coll.alltoall("ep", s, combine))
                add(post_b, a, self.coll.alltoall("ep", s, dispatch))
        emb = [i for i in range(start, end) if layers[i].kind == "embedding"]
        if self.sharded_embeddings and emb and par.dp > 1:
            size = par.batch * sum(layers[i].out_elems for i in emb) * nb
            add(post_f, emb[-1], self.coll.alltoall("embedding", s, size))
            add(pre_b, emb[-1], self.coll.alltoall("embedding", s, size))

        # gradient buckets, in backward order, per gradient group
        marks: dict[int, list[int]] = {}
        grads: list[Call] = []
        order = list(range(end - 1, start - 1, -1))
        groups = {"dp": [i for i in order if i not in experts
                         and not (self.sharded_embeddings and layers[i].kind == "embedding")],
                  "dp-expert": [i for i in order if i in experts]}
        sizes = {"dp": par.dp, "dp-expert": par.dp // par.ep}
        for dim, members in groups.items():
            if sizes[dim] < 2 or not members:
                continue
            params = [round(layers[i].params / par.tp) if layers[i].kind in _SPLIT
                      and (layers[i].kind != "embedding" or vocab_parallel(layers[i]))
                      else layers[i].params for i in members]
            buckets = gradient_buckets([layers[i].name for i in members], params,
                                       [self.bwd[i] for i in members], self.cap_bytes,
                                       bytes_per_param=nb)
            index = {layers[i].name: i for i in members}
            for bucket in buckets:
                call = self.coll.gradients(dim, s, bucket.bytes)
                marks.setdefault(index[bucket.layers[-1]], []).append(len(grads))
                grads.append(call)
                self.calls.append(call)

        forward = _segments(range(start, end), self.fwd, pre_f, post_f, {})
        backward = _segments(order, self.bwd, pre_b, post_b, marks)
        send_f, send_b = self._sends(s, start, end, s + 1 < par.pp if has_next is None
                                     else has_next, s > 0 if has_prev is None else has_prev)
        return StagePlan(forward, backward, send_f, send_b, grads)

    def _sends(self, s: int, start: int, end: int, has_next: bool,
               has_prev: bool) -> tuple[Call | None, Call | None]:
        """Step 6: the stage's activations on to the next, its input gradient back."""
        par, layers = self.par, self.model.layers
        scale = self.par.batch / par.micro_batches * par.bytes / par.tp
        send_f = self.coll.p2p(s, True, layers[end - 1].out_elems * scale) if has_next \
            else None
        send_b = self.coll.p2p((s - 1) % par.pp, False, layers[start - 1].out_elems * scale) \
            if has_prev else None
        self.calls.extend(c for c in (send_f, send_b) if c is not None)
        return send_f, send_b


def run_plans(net: SimNetwork, planner: StagePlanner, plans: list[StagePlan], micro: int,
              schedule: str, chunks: int = 1, defer: bool = False) -> tuple[Timeline, float]:
    """Schedule ``plans`` on ``net`` (step 7): the iteration, and what the pipeline alone
    (compute and bubble, no communication) takes."""
    sharing = net.sharing(st.pattern for c in planner.calls for st in c.steps)
    timeline = simulate_schedule(plans, micro, sharing, schedule, chunks, defer)
    alone = simulate_schedule(compute_only(plans), micro, sharing, schedule, chunks)
    return timeline, alone.iteration_s


def _segments(order: Any, times: list[float], pre: dict[int, list[Call]],
              post: dict[int, list[Call]], marks: dict[int, list[int]]) -> list[Segment]:
    """Compute merged between events: a segment ends at every call and bucket mark."""
    out: list[Segment] = []
    acc = 0.0
    for i in order:
        for call in pre.get(i, []):
            out.append(Segment(acc, call))
            acc = 0.0
        acc += times[i]
        if i in marks:
            out.append(Segment(acc, None, tuple(marks[i])))
            acc = 0.0
        for call in post.get(i, []):
            out.append(Segment(acc, call))
            acc = 0.0
    if acc > 0 or not out:
        out.append(Segment(acc))
    return out
