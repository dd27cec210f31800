"""``onebit``: 1-bit SGD (Seide et al., Interspeech'14): one bit per element and two
reconstruction values, with error feedback.

1. bit_i = [x_i >= 0];
2. the reconstruction values are the means of the elements in each class:
   a = mean{x_i : x_i >= 0}, b = mean{x_i : x_i < 0} (0 for an empty class), which
   minimizes the squared quantization error for the given bits;
3. payload = bits (d/8 bytes) and (a, b); decompress: a where bit = 1, else b;
4. use it with ``--memory residual``: the paper's key step is carrying the quantization
   error into the next minibatch. Per tensor here (the paper uses one pair per column).
"""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Payload
from dlcomm.compress.packing import pack_signs, unpack_signs
from dlcomm.registry import reject_unknown

__all__ = ["OneBit"]


class OneBit(Compressor):
    name = "onebit"
    fixed_size = True

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        count = int((tensor >= 0).sum())
        rest = tensor.numel() - count
        up, down = float(tensor.clamp(min=0).sum()), float(tensor.clamp(max=0).sum())
        means = torch.tensor([up / count if count else 0.0, down / rest if rest else 0.0],
                             dtype=torch.float32)
        return [pack_signs(tensor), means], tensor.numel()

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        bits, means = payload
        signs = unpack_signs(bits, ctx)
        return torch.where(signs > 0, means[0], means[1])


@COMPRESSORS.register("onebit", "1-bit SGD: a bit per element, two class means; for residual")
def _make(**options: str) -> Compressor:
    reject_unknown(options, "compressor 'onebit'")
    return OneBit()
