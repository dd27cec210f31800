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

from dataclasses import dataclass
from typing import Callable

from dlcomm.registry import Registry

__all__ = ["Layer", "ModelTable", "MODELS", "get_model"]


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


MODELS: Registry[ModelTable] = Registry("model")


def get_model(name: str) -> ModelTable:
    """The layer table of catalog model ``name`` (built on first use)."""
    factory: Callable[[], ModelTable] = MODELS.get(name)
    return factory()
