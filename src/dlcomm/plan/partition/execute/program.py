"""Catalog layer tables as executed networks, and one step of one in a single process.

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
plan matches to 3e-15, so the flips are not an error of the partitioning). The loss is
half the mean squared error against a random target; a sum over elements, it splits over
rows and columns, so every layout computes its part without communication.

The same network partitioned over ranks: :mod:`dlcomm.plan.partition.execute.model`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from dlcomm.errors import ConfigError
from dlcomm.plan.partition.graph import layer_inputs
from dlcomm.workloads.catalog.base import ModelTable

__all__ = ["Op", "EXECUTABLE_KINDS", "executable_table", "build_program", "init_weights",
           "make_batch", "apply_op", "reference_step"]

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


def apply_op(op: Op, x: torch.Tensor, w: torch.Tensor | None = None,
             b: torch.Tensor | None = None) -> torch.Tensor:
    """``op`` on ``x`` with weight ``w`` and bias ``b`` (a rank's part of them, or all)."""
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
            h = apply_op(op, h, w[0], w[1] if len(w) > 1 else None)
            h = torch.tanh(h) if op.act else h
        else:
            h = apply_op(op, h)
        if op.shortcut is not None:
            h = h + values[op.shortcut]
        values.append(h)
    out = values[-1].flatten(1)
    loss = ((out - target) ** 2).sum() / (2 * target.numel())
    loss.backward()
    return float(loss.detach()), {k: [t.grad for t in v] for k, v in params.items()}
