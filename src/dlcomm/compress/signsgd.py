"""``signsgd``: signSGD with majority vote (Bernstein et al., ICML'18 and ICLR'19).

1. payload = sign(x_i) as one bit per element (x_i >= 0 -> +1), n/8 bytes;
2. the payloads are all-gathered (bits do not add) and each worker takes the majority vote
   sign(sum_w sign(x_w,i)) (0 on a tie); the exchange returns world x that vote, so that the
   DDP hook's division by the world size leaves the vote itself;
3. the optimizer steps along the vote: the learning rate sets the step, the gradient's
   magnitude is dropped (use a small lr with SGD; Adam normalizes anyway).
"""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Payload
from dlcomm.compress.packing import pack_signs, unpack_signs
from dlcomm.registry import reject_unknown

__all__ = ["SignSGD"]


class SignSGD(Compressor):
    name = "signsgd"
    fixed_size = True
    aggregation = "majority"

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        return [pack_signs(tensor)], tensor.numel()

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        return unpack_signs(payload[0], ctx)


@COMPRESSORS.register("signsgd", "signs as bits, majority vote (Bernstein et al.)")
def _make(**options: str) -> Compressor:
    reject_unknown(options, "compressor 'signsgd'")
    return SignSGD()
