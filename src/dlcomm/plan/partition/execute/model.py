"""Catalog layer tables run partitioned over ranks (the network: program.py).

The executed network, its single-process reference step and why it is smooth:
:mod:`dlcomm.plan.partition.execute.program`. Partitioned execution on rank r (layouts.py
for the layouts, comm.py for the bytes):

1. a layer's input is redistributed from its producer's output layout into the layout its
   type needs (forward: F; the autograd backward of the same step moves E the other way);
2. type I computes its batch rows with the whole weight; type II its C_in slice of the
   weight and input, then all-reduces the partial output (backward: nothing to reduce);
   type III its C_out slice from the whole input, and all-reduces the partial input error in
   backward (not for the first layer, whose input needs no gradient);
3. a residual join redistributes the shortcut into the joining layer's output layout;
4. after backward, type I layers all-reduce their weight (and bias) gradients.

Replicated (FULL) tensors hold the true value, and their gradient the true gradient, on
every rank, as in AccPar; so every custom backward below is the layout change of the error,
never a sum over copies. Heterogeneous speed is emulated by :class:`Slowdown`: after each
local layer computation (forward and backward) a rank sleeps ``(slowdown - 1)`` times the
time it took, so a rank with slowdown 2 computes at half speed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from dlcomm.plan.partition.execute.comm import Comm
from dlcomm.plan.partition.execute.program import (
    Op,
    apply_op,
    build_program,
    executable_table,
    init_weights,
    make_batch,
    reference_step,
)
from dlcomm.plan.partition.graph import PartitionGraph
from dlcomm.plan.partition.layouts import IN_LAYOUT, Layout, PartType

# Op, executable_table, build_program, init_weights, make_batch and reference_step live in
# program.py; they stay importable from here
__all__ = ["Op", "executable_table", "build_program", "init_weights", "make_batch",
           "reference_step", "PartitionedNet", "Slowdown", "bounds_of"]


def bounds_of(split: list[int]) -> tuple[int, ...]:
    edges = [0]
    for n in split:
        edges.append(edges[-1] + n)
    return tuple(edges)


@dataclass
class DT:
    """This rank's part of a (B x C ...) tensor: the local block and how it is laid out."""

    local: torch.Tensor
    layout: Layout
    bounds: tuple[int, ...] | None   # p+1 edges along the split dim (rows or cols)
    rows: int                        # global B
    cols: int                        # global size of dim 1

    def flatten(self) -> DT:
        if self.local.dim() <= 2:
            return self
        area = math.prod(self.local.shape[2:])
        bounds = (tuple(e * area for e in self.bounds)
                  if self.layout == Layout.COLS and self.bounds else self.bounds)
        return DT(self.local.flatten(1), self.layout, bounds, self.rows, self.cols * area)


class Slowdown:
    """Emulates a slower device: sleep ``factor - 1`` times each measured compute span."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.seconds = 0.0          # compute time including the emulated slowdown
        self._start: float | None = None

    def spent(self, seconds: float) -> None:
        extra = (self.factor - 1.0) * seconds
        if extra > 0:
            time.sleep(extra)
        self.seconds += seconds + max(extra, 0.0)

    def mark(self, x: torch.Tensor, end: bool) -> torch.Tensor:
        return _Mark.apply(x, self, end) if x.requires_grad else x


class _Mark(torch.autograd.Function):
    """Backward stopwatch: the output's mark starts it, the inputs' marks stop it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: Slowdown, end: bool) -> torch.Tensor:
        ctx.clock, ctx.end = clock, end
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        clock = ctx.clock
        if ctx.end:
            clock._start = time.perf_counter()
        elif clock._start is not None:
            clock.spent(time.perf_counter() - clock._start)
            clock._start = None
        return grad, None, None


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, comm: Comm, src: DT, dst: Layout,
                dst_bounds: tuple[int, ...] | None, key: str) -> torch.Tensor:
        ctx.args = (comm, src, dst, dst_bounds, key)
        return comm.redistribute(local, src.layout, src.bounds, dst, dst_bounds, src.rows,
                                 src.cols, key).clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        comm, src, dst, dst_bounds, key = ctx.args
        back = comm.redistribute(grad.contiguous(), dst, dst_bounds, src.layout, src.bounds,
                                 src.rows, src.cols, key)
        return back.clone(), None, None, None, None, None


class _SumForward(torch.autograd.Function):
    """Type II: partial outputs summed in forward; the FULL error passes back unchanged."""

    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor, comm: Comm, key: str) -> torch.Tensor:
        return comm.allreduce(partial, key)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None, None


class _SumBackward(torch.autograd.Function):
    """Type III: the FULL input passes forward; partial input errors are summed backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm, key: str) -> torch.Tensor:
        ctx.args = (comm, key)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        comm, key = ctx.args
        return comm.allreduce(grad.contiguous(), key), None, None


class PartitionedNet:
    """One rank's share of a partitioned network (steps 1-4 of the module docstring)."""

    def __init__(self, program: tuple[Op, ...], graph: PartitionGraph, types: list[int],
                 splits: list[list[int]], batch: int, comm: Comm,
                 weights: dict[int, tuple[torch.Tensor, ...]], slowdown: float = 1.0) -> None:
        self.program, self.graph, self.comm, self.batch = program, graph, comm, batch
        self.types = [PartType(t) for t in types]
        self.bounds = [bounds_of(s) for s in splits]
        self.clock = Slowdown(slowdown)
        self.input_edge = {e.dst: i for i, e in enumerate(graph.edges) if e.kind == "input"}
        self.join_edge = {e.via: i for i, e in enumerate(graph.edges) if e.kind == "join"}
        self.params: dict[int, list[torch.Tensor]] = {}
        self.slices: dict[int, list[tuple[int, int, int] | None]] = {}
        for node, full in weights.items():
            t, (lo, hi) = self.types[node], self._mine(node)
            if t == PartType.I:
                cuts: list[tuple[int, int, int] | None] = [None] * len(full)
            elif t == PartType.II:
                cuts = [(1, lo, hi)] + [None] * (len(full) - 1)
            else:
                cuts = [(0, lo, hi)] * len(full)
            self.params[node] = [(_take(w, cut)).clone().requires_grad_(True)
                                 for w, cut in zip(full, cuts)]
            self.slices[node] = cuts

    def _mine(self, node: int) -> tuple[int, int]:
        b = self.bounds[node]
        return b[self.comm.rank], b[self.comm.rank + 1]

    def _layer(self, op: Op, x: DT) -> DT:
        node = op.node
        assert node is not None
        t, b = self.types[node], self.bounds[node]
        x = x.flatten() if op.kind == "linear" else x
        key = f"edge{self.input_edge[node]}" if node in self.input_edge else f"free{node}"
        need = IN_LAYOUT[t]
        h = _Redistribute.apply(x.local, self.comm, x, need,
                                b if need != Layout.FULL else None, key)
        if t == PartType.III and h.requires_grad:
            h = _SumBackward.apply(h, self.comm, f"intra{node}")
        params = self.params[node]
        w = self.clock.mark(params[0], end=False)
        h = self.clock.mark(h, end=False)
        bias = params[1] if len(params) > 1 and t != PartType.II else None
        start = time.perf_counter()
        y = apply_op(op, h, w, bias)
        self.clock.spent(time.perf_counter() - start)
        y = self.clock.mark(y, end=True)
        if t == PartType.II:
            y = _SumForward.apply(y, self.comm, f"intra{node}")
            if len(params) > 1:
                y = y + params[1].view(1, -1, *([1] * (y.dim() - 2)))
        y = torch.tanh(y) if op.act else y
        c_out = op.out_shape[0]
        if t == PartType.I:
            return DT(y, Layout.ROWS, b, self.batch, c_out)
        if t == PartType.II:
            return DT(y, Layout.FULL, None, self.batch, c_out)
        return DT(y, Layout.COLS, b, self.batch, c_out)

    def forward(self, x: torch.Tensor) -> DT:
        values: list[DT] = []
        source = DT(x, Layout.FULL, None, x.shape[0], x.shape[1])
        for op in self.program:
            h = source if op.input < 0 else values[op.input]
            if op.node is not None:
                h = self._layer(op, h)
            else:
                h = DT(apply_op(op, h.local), h.layout, h.bounds, h.rows, h.cols)
            if op.shortcut is not None:
                s = values[op.shortcut]
                key = f"edge{self.join_edge[op.name]}" if op.name in self.join_edge \
                    else f"free-join{op.index}"
                moved = _Redistribute.apply(s.local, self.comm, s, h.layout, h.bounds, key)
                h = DT(h.local + moved, h.layout, h.bounds, h.rows, h.cols)
            values.append(h)
        return values[-1].flatten()

    def loss(self, out: DT, target: torch.Tensor) -> torch.Tensor:
        """This rank's part of the loss (the whole loss when the output is FULL)."""
        rows = (out.bounds[self.comm.rank], out.bounds[self.comm.rank + 1]) \
            if out.layout == Layout.ROWS else (0, out.rows)
        cols = (out.bounds[self.comm.rank], out.bounds[self.comm.rank + 1]) \
            if out.layout == Layout.COLS else (0, out.cols)
        t = target[rows[0]:rows[1], cols[0]:cols[1]]
        return ((out.local - t) ** 2).sum() / (2 * target.numel())

    def reduce_gradients(self) -> None:
        """Step 4: type I layers sum their weight gradients over ranks."""
        for node, params in sorted(self.params.items()):
            if self.types[node] != PartType.I:
                continue
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            total = self.comm.allreduce(flat, f"intra{node}")
            offset = 0
            for p in params:
                p.grad.copy_(total[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def sgd(self, lr: float) -> None:
        with torch.no_grad():
            for params in self.params.values():
                for p in params:
                    p -= lr * p.grad
                    p.grad = None

    def gradients(self) -> dict[int, list[torch.Tensor]]:
        return {k: [p.grad.detach().clone() for p in v] for k, v in self.params.items()}


def _take(t: torch.Tensor, cut: tuple[int, int, int] | None) -> torch.Tensor:
    if cut is None:
        return t
    dim, lo, hi = cut
    return t.narrow(dim, lo, hi - lo)
