"""Catalog layer tables run for real: single-process reference and partitioned over ranks.

The executed network is the table's data flow (graph.layer_inputs, ``shortcut_from``):
convolutions (stride and padding recovered from the feature-map areas), linear layers,
pooling, residual additions, and batch norm as the identity (batch statistics of a
batch-split layer would need a reduction of their own, outside AccPar's model; its
parameters are dropped, see :func:`executable_table`). The network is kept *smooth*: tanh
after every conv/linear but the last, and window pooling averages instead of taking the
maximum. A partitioned layer adds its partial sums in another order than one process does,
so results differ by rounding (~1e-7 in float32); at a kink (ReLU at 0, a near-tie in a
max-pool window) such a difference can flip the branch and change that element's gradient
by O(1). With smooth functions the rounding stays rounding (in float64 a ReLU ResNet-18
plan matches to 3e-15, so the flips are not an error of the partitioning). The loss is half the mean squared error
against a random target; a sum over elements, it splits over rows and columns, so every
layout computes its part without communication.

Partitioned execution on rank r (layouts.py for the layouts, comm.py for the bytes):

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
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from dlcomm.errors import ConfigError
from dlcomm.plan.partition.execute.comm import Comm
from dlcomm.plan.partition.graph import PartitionGraph, layer_inputs
from dlcomm.plan.partition.layouts import IN_LAYOUT, Layout, PartType
from dlcomm.workloads.catalog.base import ModelTable

__all__ = ["Op", "executable_table", "build_program", "init_weights", "make_batch",
           "reference_step", "PartitionedNet", "Slowdown", "bounds_of"]

EXECUTABLE_KINDS = ("conv", "linear", "pool", "norm")


@dataclass(frozen=True)
class Op:
    index: int
    name: str
    kind: str               # conv | linear | pool (window average) | avgpool | identity
    input: int              # op whose output this reads; -1: the network input
    shortcut: int | None    # op whose output is added to this op's output
    node: int | None        # partition node (conv and linear)
    act: bool               # tanh on the output
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    kernel: int = 1
    stride: int = 1
    padding: int = 0
    bias: bool = False


def executable_table(table: ModelTable) -> ModelTable:
    """The table as executed: batch norm becomes a parameter-free identity."""
    bad = [f"{x.name} ({x.kind})" for x in table.layers if x.kind not in EXECUTABLE_KINDS]
    if bad:
        raise ConfigError(f"cannot execute {table.name}: only conv, linear, pool and norm "
                          f"layers run for real, not {', '.join(bad[:3])}")
    layers = tuple(replace(x, params=0) if x.kind == "norm" else x for x in table.layers)
    return replace(table, layers=layers)


def _side(area: int, what: str) -> int:
    side = math.isqrt(area)
    if side * side != area:
        raise ConfigError(f"cannot execute {what}: feature map of area {area} is not square")
    return side


def _geometry(h_in: int, h_out: int, kernel: int, what: str, max_pad: int) -> tuple[int, int]:
    """Stride and padding that take ``h_in`` to ``h_out`` with a ``kernel`` window."""
    guess = max(1, round(h_in / max(h_out, 1)))
    for stride in dict.fromkeys([guess, *range(1, h_in + 1)]):
        for pad in dict.fromkeys([(kernel - 1) // 2, *range(0, max_pad + 1)]):
            if pad <= max_pad and (h_in + 2 * pad - kernel) // stride + 1 == h_out:
                return stride, pad
    raise ConfigError(f"cannot execute {what}: no stride/padding takes {h_in} to {h_out} "
                      f"with a {kernel}x{kernel} window")


def build_program(table: ModelTable) -> tuple[Op, ...]:
    """The ops of the executed network, in table order (module docstring)."""
    table = executable_table(table)
    inputs = layer_inputs(table)
    index_of = {x.name: i for i, x in enumerate(table.layers)}
    partitioned = [i for i, x in enumerate(table.layers) if x.kind in ("conv", "linear")]
    last = partitioned[-1] if partitioned else -1
    ops: list[Op] = []
    for i, (layer, src) in enumerate(zip(table.layers, inputs)):
        what = f"{table.name} layer {layer.name!r}"
        shortcut = index_of[layer.shortcut_from] if layer.shortcut_from else None
        node = partitioned.index(i) if i in partitioned else None
        if layer.kind == "linear":
            if layer.area_in != 1:
                raise ConfigError(f"cannot execute {what}: linear layers over tokens")
            in_shape: tuple[int, ...] = (layer.c_in,)
            out_shape: tuple[int, ...] = (layer.c_out,)
            geometry = (1, 1, 0)
        else:
            h_in, h_out = _side(layer.area_in, what), _side(layer.area_out, what)
            in_shape, out_shape = (layer.c_in, h_in, h_in), (layer.c_out, h_out, h_out)
            if layer.kind == "conv":
                geometry = (layer.kernel, *_geometry(h_in, h_out, layer.kernel, what,
                                                     layer.kernel))
            else:
                geometry = (1, 1, 0)
        kind = layer.kind
        if kind == "norm" or (kind == "pool" and layer.area_in == layer.area_out):
            kind = "identity"
        elif kind == "pool":
            try:
                geometry = (layer.kernel, *_geometry(h_in, h_out, layer.kernel, what,
                                                     layer.kernel // 2))
                kind = "pool"
            except ConfigError:
                kind = "avgpool"
        bias = False
        if layer.kind in ("conv", "linear"):
            weights = layer.c_in * layer.c_out * layer.kernel ** 2
            if layer.params not in (weights, weights + layer.c_out):
                raise ConfigError(f"cannot execute {what}: {layer.params} parameters are "
                                  "not a dense weight (and bias)")
            bias = layer.params == weights + layer.c_out
        ops.append(Op(i, layer.name, kind, src, shortcut, node,
                      layer.kind in ("conv", "linear") and i != last, in_shape, out_shape,
                      geometry[0], geometry[1], geometry[2], bias))
        if src >= 0 and math.prod(ops[src].out_shape) != math.prod(in_shape):
            raise ConfigError(f"cannot execute {what}: its input has "
                              f"{math.prod(ops[src].out_shape)} elements, not "
                              f"{math.prod(in_shape)}")
    return tuple(ops)


def init_weights(program: tuple[Op, ...], seed: int,
                 dtype: torch.dtype = torch.float32) -> dict[int, tuple[torch.Tensor, ...]]:
    """Full weights (and biases) of every conv/linear, the same on every rank."""
    out = {}
    for op in program:
        if op.node is None:
            continue
        gen = torch.Generator().manual_seed(seed * 10_007 + op.node)
        c_out, c_in = op.out_shape[0], op.in_shape[0]
        shape = (c_out, c_in, op.kernel, op.kernel) if op.kind == "conv" else (c_out, c_in)
        fan_in = c_in * op.kernel ** 2
        w = (torch.randn(shape, generator=gen) * math.sqrt(1.0 / fan_in)).to(dtype)
        b = (torch.randn(c_out, generator=gen) * 0.1).to(dtype) if op.bias else None
        out[op.node] = (w, b) if b is not None else (w,)
    return out


def make_batch(program: tuple[Op, ...], batch: int, seed: int, step: int,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Input and target of one step, the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 7_919 + 1_000 + step)
    x = torch.randn((batch, *program[0].in_shape), generator=gen)
    target = torch.randn((batch, math.prod(program[-1].out_shape)), generator=gen)
    return x.to(dtype), target.to(dtype)


def _apply(op: Op, x: torch.Tensor, w: torch.Tensor | None = None,
           b: torch.Tensor | None = None) -> torch.Tensor:
    if w is not None and (x.numel() == 0 or w.numel() == 0):
        # an empty part (more ranks than channels): this rank contributes zeros, and the
        # zero-sized gradients of its empty slices still flow through autograd
        shape = (x.shape[0], w.shape[0], *op.out_shape[1:])
        return x.new_zeros(shape) + 0.0 * (w.sum() + x.sum())
    if op.kind == "conv":
        return F.conv2d(x, w, b, stride=op.stride, padding=op.padding)
    if op.kind == "linear":
        return F.linear(x.flatten(1), w, b)
    if op.kind == "pool":
        return F.avg_pool2d(x, op.kernel, op.stride, op.padding)
    if op.kind == "avgpool":
        return F.adaptive_avg_pool2d(x, op.out_shape[1:])
    return x


def reference_step(program: tuple[Op, ...], weights: dict[int, tuple[torch.Tensor, ...]],
                   x: torch.Tensor, target: torch.Tensor) -> tuple[float, dict[int, list]]:
    """Loss and full gradients of one step in a single process."""
    params = {k: [t.clone().requires_grad_(True) for t in v] for k, v in weights.items()}
    values: list[torch.Tensor] = []
    for op in program:
        h = x if op.input < 0 else values[op.input]
        if op.node is not None:
            w = params[op.node]
            h = _apply(op, h, w[0], w[1] if len(w) > 1 else None)
            h = torch.tanh(h) if op.act else h
        else:
            h = _apply(op, h)
        if op.shortcut is not None:
            h = h + values[op.shortcut]
        values.append(h)
    out = values[-1].flatten(1)
    loss = ((out - target) ** 2).sum() / (2 * target.numel())
    loss.backward()
    return float(loss.detach()), {k: [t.grad for t in v] for k, v in params.items()}


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

    def flatten(self) -> "DT":
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
        y = _apply(op, h, w, bias)
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
                h = DT(_apply(op, h.local), h.layout, h.bounds, h.rows, h.cols)
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
