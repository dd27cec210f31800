"""``qsgd``: QSGD (Alistarh et al., NeurIPS'17, section 3.1): s levels scaled by the norm.

Q_s(x_i) = ||x||_2 * sign(x_i) * xi_i(x, s) / s, where xi_i = l or l + 1 with probability
v - l, v = |x_i| s / ||x||_2, l = floor(v): unbiased (Lemma 3.1), variance at most
min(n/s^2, sqrt(n)/s) ||x||^2. ``norm=inf`` scales by max |x_i| instead (lower variance,
as in the QSGD paper's experiments and GRACE's default). Levels travel as summable packed
integers after the workers agree on the largest scale (quantizer.py); default s = 127.
"""

from __future__ import annotations

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor
from dlcomm.compress.quantizer import StochasticQuantizer
from dlcomm.registry import reject_unknown, take_option

__all__ = ["QSGD"]


class QSGD(StochasticQuantizer):
    name = "qsgd"

    def __init__(self, levels: int = 127, norm: str = "2", seed: int = 0) -> None:
        super().__init__(seed)
        self.levels, self.norm = levels, norm

    def scale_of(self, tensor: torch.Tensor) -> float:
        if self.norm == "inf":
            return super().scale_of(tensor)
        return float(torch.linalg.vector_norm(tensor))


@COMPRESSORS.register("qsgd", "QSGD stochastic levels (levels=127, norm=2|inf); summable "
                      "with an agreed scale")
def _make(**options: str) -> Compressor:
    owner = "compressor 'qsgd'"
    levels = take_option(options, "levels", int, 127, owner, lambda v: 1 <= v <= 32767,
                    "1 <= levels <= 32767")
    norm = take_option(options, "norm", str, "2", owner, lambda v: v in ("2", "inf"), "2 or inf")
    seed = take_option(options, "seed", int, 0, owner)
    reject_unknown(options, owner)
    return QSGD(levels, norm, seed)
