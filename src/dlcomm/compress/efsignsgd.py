"""``efsignsgd``: scaled sign with error feedback (Karimireddy et al., "Error Feedback Fixes
SignSGD", ICML'19, Algorithm 2).

1. p = x + e (the ``residual`` memory adds e; use ``--memory residual``);
2. payload = (||p||_1 / d) and sign(p) as bits: d/8 + 4 bytes;
3. decompress: (||p||_1 / d) * sign(p); the memory keeps e = p - that;
4. all-gathered and summed (scales differ per worker, so the bits are not summable).
"""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Payload
from dlcomm.compress.packing import pack_signs, unpack_signs
from dlcomm.registry import reject_unknown

__all__ = ["EFSignSGD"]


class EFSignSGD(Compressor):
    name = "efsignsgd"
    fixed_size = True

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        scale = tensor.abs().mean() if tensor.numel() else torch.tensor(0.0)
        return [pack_signs(tensor), scale.reshape(1).to(torch.float32)], tensor.numel()

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        bits, scale = payload
        return unpack_signs(bits, ctx).mul_(float(scale[0]))


@COMPRESSORS.register("efsignsgd", "scaled sign ||x||_1/d * sign(x), for error feedback")
def _make(**options: str) -> Compressor:
    reject_unknown(options, "compressor 'efsignsgd'")
    return EFSignSGD()
