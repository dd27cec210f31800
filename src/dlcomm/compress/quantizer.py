"""Shared form of the stochastic quantizers with a scale (qsgd, terngrad, u8bit).

A quantizer with s levels maps x to integers in [-s, s] with *stochastic rounding*:

    v = |x_i| / S * s in [0, s],   l = floor(v),   q_i = sign(x_i) * (l + [u_i < v - l]),
    u_i ~ U[0, 1),   decompress: x_i ~ q_i * S / s,

so E[q_i * S / s] = x_i (unbiased) whenever S >= |x_i|. Alone (GRACE's compress), S is this
worker's scale and travels in the payload. In an exchange the workers first agree on
S = max over workers of their scales (one tiny max all-reduce; TernGrad's "scaler sharing",
Wen et al. NeurIPS'17, section 3.2), which keeps every worker unbiased; then the integer
levels are aligned and **summable**: they travel as packed integer lanes (packing.py) and
sum(q) * S / s is the sum of the decompressed tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dlcomm.compress.base import Compressor, Outcome, Payload, Protocol, Round

__all__ = ["StochasticQuantizer", "stochastic_levels", "level_dtype", "uniforms"]


def level_dtype(levels: int) -> torch.dtype:
    return torch.int8 if levels <= 127 else torch.int16 if levels <= 32767 else torch.int32


def uniforms(n: int, rng: np.random.Generator) -> torch.Tensor:
    """n draws from U[0, 1) as float32 (NumPy's PCG64: several times faster than torch's
    Mersenne twister on a CPU, which dominated the quantizers' time)."""
    return torch.from_numpy(rng.random(n, dtype=np.float32))


def stochastic_levels(tensor: torch.Tensor, scale: float, levels: int,
                      rng: np.random.Generator) -> torch.Tensor:
    """Integers in [-levels, levels] with E[q * scale / levels] = tensor (if scale >= |x|)."""
    if scale <= 0:
        return torch.zeros(tensor.numel(), dtype=level_dtype(levels))
    v = tensor.abs().mul_(levels / scale).clamp_(max=levels)   # in [0, s]
    low = v.floor()
    v -= low                                                   # the fraction to round up
    low += uniforms(v.numel(), rng).view(v.shape) < v
    return low.mul_(torch.sign(tensor)).to(level_dtype(levels))


class StochasticQuantizer(Compressor):
    """Base: subclasses define ``levels`` and ``scale_of``; summable with an agreed scale."""

    summable = True
    levels = 1

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def bind(self, rank: int, world: int) -> None:
        self.rng = np.random.default_rng([self.seed, rank])  # independent rounding per worker

    def scale_of(self, tensor: torch.Tensor) -> float:
        """This worker's scale S (it must bound |x_i| for unbiasedness)."""
        return float(tensor.abs().max()) if tensor.numel() else 0.0

    def prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor to quantize (TernGrad clips it)."""
        return tensor

    def levels_of(self, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        """The integer levels of ``tensor`` under ``scale`` (stochastic rounding)."""
        return stochastic_levels(tensor, scale, self.levels, self.rng)

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        x = self.prepare(tensor)
        scale = self.scale_of(x)
        q = self.levels_of(x, scale)
        return [q, torch.tensor([scale], dtype=torch.float32)], None

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        q, scale = payload
        return q.to(torch.float32).mul_(float(scale[0]) / self.levels)

    def payload_levels(self) -> int | None:
        return self.levels

    def rounds(self, tensor: torch.Tensor, name: str, world: int,
               shapes: list[torch.Size] | None = None) -> Protocol:
        x = self.prepare(tensor)
        agreed = yield Round([torch.tensor([self.scale_of(x)], dtype=torch.float32)], "max")
        scale = float(agreed[0][0])
        q = self.levels_of(x, scale)
        sums = yield Round([q], "sum", self.levels)
        factor = scale / self.levels
        return Outcome(sums[0].to(torch.float32).mul_(factor),
                       local=lambda: q.to(torch.float32).mul_(factor),
                       info={"scale": scale})

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "levels": self.levels}
