"""``terngrad``: TernGrad (Wen et al., NeurIPS'17, eq. 2): ternary {-1, 0, 1} times a scale.

t_i = s * sign(x_i) * b_i, s = max |x|, b_i ~ Bernoulli(|x_i| / s): unbiased. Scaler sharing
(section 3.2): every worker uses the largest s over workers, so the ternary values are
summable (2-3 bits per element after lane packing on 4 workers). ``clip=c`` clips x to
[-c sigma, c sigma] first (the paper's gradient clipping, c = 2.5; biased; off by default).
"""

from __future__ import annotations

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor
from dlcomm.compress.quantizer import StochasticQuantizer
from dlcomm.registry import reject_unknown, take_option

__all__ = ["TernGrad"]


class TernGrad(StochasticQuantizer):
    name = "terngrad"
    levels = 1

    def __init__(self, clip: float = 0.0, seed: int = 0) -> None:
        super().__init__(seed)
        self.clip = clip

    def prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.clip <= 0 or tensor.numel() < 2:
            return tensor
        bound = self.clip * float(tensor.std())
        return tensor.clamp(-bound, bound)


@COMPRESSORS.register("terngrad", "TernGrad ternary levels x shared max (clip=0); summable")
def _make(**options: str) -> Compressor:
    owner = "compressor 'terngrad'"
    clip = take_option(options, "clip", float, 0.0, owner, lambda v: v >= 0, "clip >= 0")
    seed = take_option(options, "seed", int, 0, owner)
    reject_unknown(options, owner)
    return TernGrad(clip, seed)
