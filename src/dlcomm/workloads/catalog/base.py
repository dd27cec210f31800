"""Layer tables of big models: the shared vocabulary of emulation, planning and simulation.

A :class:`ModelTable` lists a model's layers in forward order with, per layer and per
*sample* (one image, one sequence, one click record): trainable parameters, forward FLOPs
(a multiply-add counts 2), input and output activation elements, and the shape facts that
tensor partitioning needs (a layer seen as F (B x c_in x area_in) times W -> F' (B x c_out x
area_out), with a K x K kernel for convolutions). Backward costs about twice the forward.

Tables are derived from model definitions written in this package (instantiated on
PyTorch's meta device, so no memory is used) or from closed-form formulas, and are checked
against the parameter counts their authors published.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from dlcomm.registry import Registry

__all__ = ["Layer", "ModelTable", "MODELS", "get_model", "register_model", "KINDS"]

# The layer kinds a table may use. Element-wise, parameter-free work (activations, dropout,
# residual additions) is folded into the layer that produced its input. ``shortcut_from``
# also marks other joins of a second input (the concatenations of recommenders).
KINDS = ("conv", "linear", "embedding", "attention", "norm", "lstm", "pool", "other")


@dataclass(frozen=True)
class Layer:
    name: str                 # e.g. "layer1.0.conv1", "h.11.attn.qkv"
    kind: str                 # conv | linear | embedding | attention | norm | lstm | pool | other
    params: int               # trainable parameters
    flops: float              # forward FLOPs per sample (multiply-add = 2)
    in_elems: int             # input activation elements per sample
    out_elems: int            # output activation elements per sample
    c_in: int = 0             # input channels / features (0 when not meaningful)
    c_out: int = 0            # output channels / features
    kernel: int = 1           # K of a K x K convolution; 1 otherwise
    area_in: int = 1          # H*W of the input feature map, or tokens per sample
    area_out: int = 1         # H*W of the output feature map, or tokens per sample
    shortcut_from: str | None = None  # residual join: the layer whose output is added here


@dataclass(frozen=True)
class ModelTable:
    name: str                 # catalog name, e.g. "resnet50"
    family: str               # cnn | transformer | recommender | rnn
    layers: tuple[Layer, ...]  # forward order
    sample: str               # what one sample is, e.g. "3x224x224 image", "2048 tokens"
    published_params: float  # the count its authors report
    source: str               # where that count is published
    default_batch: int        # typical per-accelerator batch (samples)

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def flops_per_sample(self) -> float:
        """Forward FLOPs of one sample."""
        return sum(layer.flops for layer in self.layers)

    def gradient_bytes(self, bytes_per_param: int = 4) -> int:
        return self.params * bytes_per_param

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for layer in self.layers:
            if layer.name in seen:
                raise ValueError(f"{self.name}: layer {layer.name!r} listed twice")
            if layer.kind not in KINDS:
                raise ValueError(f"{self.name}: layer {layer.name!r} has unknown kind "
                                 f"{layer.kind!r}")
            if layer.shortcut_from is not None and layer.shortcut_from not in seen:
                raise ValueError(f"{self.name}: {layer.name!r} joins {layer.shortcut_from!r}, "
                                 "which is not an earlier layer")
            seen.add(layer.name)

    def layer(self, name: str) -> Layer:
        """The layer called ``name`` (KeyError if there is none)."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"{self.name} has no layer {name!r}")

    @property
    def params_error(self) -> float:
        """Relative difference of the table's parameter count from the published one."""
        return self.params / self.published_params - 1.0

    def sparse_layers(self) -> tuple[Layer, ...]:
        """Embedding layers whose gradient is row-sparse (only looked-up rows are non-zero).

        An embedding's gradient touches at most ``batch x in_elems`` of its ``c_in`` rows
        (``in_elems`` is its lookups per sample). Not listed: tables that one sample reads
        in full (position and segment embeddings), and tables whose weights a later
        parameter-free linear layer of the transposed shape reuses (GPT's LM head tied to
        the token embedding), which receive a dense gradient through that layer.
        """
        tied = {(layer.c_out, layer.c_in) for layer in self.layers
                if layer.kind == "linear" and layer.params == 0}
        return tuple(layer for layer in self.layers if layer.kind == "embedding"
                     and layer.in_elems < layer.c_in
                     and (layer.c_in, layer.c_out) not in tied)

    @property
    def embedding_params(self) -> int:
        """Parameters in embedding tables (sparse or tied)."""
        return sum(layer.params for layer in self.layers if layer.kind == "embedding")


MODELS: Registry[ModelTable] = Registry("model")


def register_model(name: str, doc: str) -> Callable[[Callable[[], ModelTable]],
                                                    Callable[[], ModelTable]]:
    """Register a table builder under ``name``; the table is built once and cached."""
    def decorator(build: Callable[[], ModelTable]) -> Callable[[], ModelTable]:
        cached = functools.cache(build)
        MODELS.register(name, doc)(cached)
        return cached
    return decorator


def get_model(name: str) -> ModelTable:
    """The layer table of catalog model ``name`` (built on first use, then cached).

    Raises RegistryError (a ConfigError) with the known names if ``name`` is unknown.
    """
    factory: Callable[[], ModelTable] = MODELS.get(name)
    return factory()
