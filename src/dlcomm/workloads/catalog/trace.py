"""Layer tables from torch.nn modules, by one forward pass on PyTorch's meta device.

The model is built under ``torch.device("meta")`` (parameters have shapes but no storage)
and run on a meta tensor of one sample, so even a 100M-parameter CNN costs no memory and
milliseconds. The trace:

1. hooks every leaf module; each call reports (module, inputs, output) in forward order;
2. turns a call of a conv, linear, batch-norm or pool module into a :class:`Layer` with its
   own parameters, its forward FLOPs computed from the shapes, and its activation sizes;
3. folds a parameter-free element-wise module (ReLU, Dropout, Flatten) into the layer that
   produced its input, adding its small FLOPs there;
4. folds an :class:`Add` (a residual join, ``main + shortcut``) into the layer that
   produced ``main`` and records the layer that produced ``shortcut`` as that layer's
   ``shortcut_from``. Producers are found by tensor identity, so the tables follow the
   data flow of the forward code, not the order of attribute declarations.

FLOPs (a multiply-add counts 2; bias additions are not counted):

- Conv2d: ``2 K^2 (C_in / groups) C_out H_out W_out``
- Linear: ``2 in out`` per row (rows = tokens or 1)
- BatchNorm: ``NORM_FLOPS`` per element; max pool: ``K^2`` comparisons per output element;
  adaptive average pool: one addition per input element
- folded element-wise modules: ``ELEMENTWISE_FLOPS[type]`` per output element
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from math import prod

import torch
from torch import nn

from dlcomm.workloads.catalog.base import Layer

__all__ = ["Add", "trace_layers", "NORM_FLOPS", "ELEMENTWISE_FLOPS"]

# Normalisation: subtract the mean, divide by the deviation, scale, shift, plus the share of
# computing the statistics: a nominal 5 FLOPs per element (<1% of any catalog model).
NORM_FLOPS = 5
# Parameter-free element-wise modules folded into their producer, FLOPs per output element.
ELEMENTWISE_FLOPS: dict[type[nn.Module], int] = {
    nn.ReLU: 1, nn.Tanh: 1, nn.Sigmoid: 1, nn.GELU: 1, nn.Dropout: 1, nn.Flatten: 0,
}


class Add(nn.Module):
    """A residual join ``main + shortcut``; the tracer records where ``shortcut`` came from."""

    def forward(self, main: torch.Tensor, shortcut: torch.Tensor) -> torch.Tensor:
        return main + shortcut


def _area(t: torch.Tensor) -> int:
    return prod(t.shape[2:]) if t.dim() > 2 else 1


def _conv(name: str, m: nn.Conv2d, x: torch.Tensor, y: torch.Tensor) -> Layer:
    k = m.kernel_size[0]
    c_in, c_out = x.shape[1], y.shape[1]
    flops = 2 * k * m.kernel_size[1] * (c_in // m.groups) * c_out * _area(y)
    return Layer(name, "conv", _params(m), float(flops), x.numel(), y.numel(), c_in, c_out,
                 k, _area(x), _area(y))


def _linear(name: str, m: nn.Linear, x: torch.Tensor, y: torch.Tensor) -> Layer:
    rows = x.numel() // m.in_features
    return Layer(name, "linear", _params(m), 2.0 * m.in_features * m.out_features * rows,
                 x.numel(), y.numel(), m.in_features, m.out_features, 1, rows, rows)


def _norm(name: str, m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Layer:
    return Layer(name, "norm", _params(m), float(NORM_FLOPS * y.numel()), x.numel(),
                 y.numel(), x.shape[1], y.shape[1], 1, _area(x), _area(y))


def _max_pool(name: str, m: nn.MaxPool2d, x: torch.Tensor, y: torch.Tensor) -> Layer:
    k = m.kernel_size if isinstance(m.kernel_size, int) else m.kernel_size[0]
    return Layer(name, "pool", 0, float(k * k * y.numel()), x.numel(), y.numel(),
                 x.shape[1], y.shape[1], k, _area(x), _area(y))


def _avg_pool(name: str, m: nn.AdaptiveAvgPool2d, x: torch.Tensor, y: torch.Tensor) -> Layer:
    k = max(1, x.shape[2] // y.shape[2])
    return Layer(name, "pool", 0, float(x.numel()), x.numel(), y.numel(), x.shape[1],
                 y.shape[1], k, _area(x), _area(y))


def _params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters(recurse=False))


_DESCRIBE: dict[type[nn.Module], Callable[..., Layer]] = {
    nn.Conv2d: _conv, nn.Linear: _linear, nn.BatchNorm2d: _norm, nn.MaxPool2d: _max_pool,
    nn.AdaptiveAvgPool2d: _avg_pool,
}


@dataclass
class _Trace:
    """Mutable state of one traced forward pass."""

    layers: list[Layer]
    producer: dict[int, int]       # id(output tensor) -> index of the layer that made it
    alive: list[torch.Tensor]      # keeps traced tensors alive so their ids stay unique

    def source(self, t: torch.Tensor) -> int:
        try:
            return self.producer[id(t)]
        except KeyError:
            raise ValueError("an element-wise module consumes the model input; "
                             "it has no layer to fold into") from None

    def fold(self, t: torch.Tensor, out: torch.Tensor, flops: float,
             shortcut: torch.Tensor | None = None) -> None:
        index = self.source(t)
        layer = self.layers[index]
        joined = self.layers[self.source(shortcut)].name if shortcut is not None else None
        self.layers[index] = replace(layer, flops=layer.flops + flops,
                                     shortcut_from=joined or layer.shortcut_from)
        self.producer[id(out)] = index

    def on_call(self, name: str, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self.alive.extend([*inputs, output])
        x = inputs[0]
        kind = type(module)
        if kind is Add:
            self.fold(x, output, float(output.numel()), shortcut=inputs[1])
        elif kind in ELEMENTWISE_FLOPS:
            self.fold(x, output, float(ELEMENTWISE_FLOPS[kind] * output.numel()))
        elif kind in _DESCRIBE:
            self.layers.append(_DESCRIBE[kind](name, module, x, output))
            self.producer[id(output)] = len(self.layers) - 1
        else:
            raise TypeError(f"cannot describe module {name!r} of type {kind.__name__}")


def trace_layers(build: Callable[[], nn.Module],
                 sample_shape: tuple[int, ...]) -> tuple[Layer, ...]:
    """The layers of ``build()`` in forward order, per sample of shape ``sample_shape``.

    ``build`` is called under the meta device; one sample (batch 1) is pushed through, so
    every size and FLOP count is per sample.
    """
    with torch.device("meta"):
        model = build()
    model.eval()  # shapes and FLOPs are the same in train mode; eval leaves BN stats alone
    trace = _Trace([], {}, [])
    handles = [module.register_forward_hook(
                   lambda m, i, o, name=name: trace.on_call(name, m, i, o))
               for name, module in model.named_modules() if not list(module.children())]
    try:
        with torch.no_grad():
            model(torch.empty((1, *sample_shape), device="meta"))
    finally:
        for handle in handles:
            handle.remove()
    return tuple(trace.layers)
