"""``threshold``: keep every element with |x_i| >= tau (Strom, Interspeech'15; "hard
threshold" sparsification in GRACE).

1. idx = {i : |x_i| >= tau};
2. payload = (x[idx], idx): 8 bytes per kept element; how many varies per worker and step,
   so the all-gather first exchanges the sizes and then moves exactly that many bytes;
3. decompress: zeros with x[idx] at idx.

Biased; meant for error feedback (``--memory residual``): small elements accumulate in the
residual until they cross tau.
"""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Payload, positive
from dlcomm.compress.sparse import Sparsifier, sparse_payload
from dlcomm.registry import reject_unknown, take_option

__all__ = ["Threshold"]


class Threshold(Sparsifier):
    name = "threshold"

    def __init__(self, tau: float = 1e-3) -> None:
        self.tau = tau

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        idx = torch.nonzero(tensor.abs() >= self.tau, as_tuple=True)[0]
        return sparse_payload(tensor, idx), tensor.numel()


@COMPRESSORS.register("threshold", "elements with |x| >= tau, with indices (tau=0.001)")
def _make(**options: str) -> Compressor:
    tau = take_option(options, "tau", float, 1e-3, "compressor 'threshold'", positive, "tau > 0")
    reject_unknown(options, "compressor 'threshold'")
    return Threshold(tau)
