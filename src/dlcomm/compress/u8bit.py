"""``u8bit``: an 8-bit linear quantizer: 127 levels on each side of zero, scaled by max |x|.

q_i = stochastic rounding of x_i * 127 / S to an integer in [-127, 127], S = max |x| agreed
over workers (the largest): unbiased, error at most S/127 per element. With ``stochastic=0``
it rounds to nearest instead (biased, error at most S/254). The levels are summable: packed
as integer lanes (10 bits per value on 4 workers: 3 per int32 word, 2 per switch word).
"""

from __future__ import annotations

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor
from dlcomm.compress.quantizer import StochasticQuantizer, level_dtype
from dlcomm.registry import reject_unknown, take_option

__all__ = ["EightBit"]


class EightBit(StochasticQuantizer):
    name = "u8bit"
    levels = 127

    def __init__(self, stochastic: bool = True, seed: int = 0) -> None:
        super().__init__(seed)
        self.stochastic = stochastic

    def levels_of(self, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        if self.stochastic:
            return super().levels_of(tensor, scale)
        if scale <= 0:
            return torch.zeros(tensor.numel(), dtype=level_dtype(self.levels))
        q = (tensor * (self.levels / scale)).round_().clamp_(-self.levels, self.levels)
        return q.to(level_dtype(self.levels))


@COMPRESSORS.register("u8bit", "8-bit levels x shared max (stochastic=1); summable")
def _make(**options: str) -> Compressor:
    owner = "compressor 'u8bit'"
    stochastic = take_option(options, "stochastic", int, 1, owner, lambda v: v in (0, 1), "0 or 1")
    seed = take_option(options, "seed", int, 0, owner)
    reject_unknown(options, owner)
    return EightBit(bool(stochastic), seed)
