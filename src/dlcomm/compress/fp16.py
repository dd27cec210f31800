"""``fp16``: half-precision floats (as torch's ``fp16_compress_hook``): 2 bytes per element.

1. divide by the world size n first, so that the sum of n halves cannot overflow
   (the largest float16 is 65504), as torch's hook does;
2. cast to float16 (round to nearest even, 11 significant bits);
3. the exchange sums the halves (natively where it can, else as exact float32 values);
4. cast back to float32 and multiply by n.
"""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Outcome, Payload, Protocol, Round
from dlcomm.registry import reject_unknown

__all__ = ["HalfCompressor"]


class HalfCompressor(Compressor):
    """Cast to a 16-bit float type; payloads are summable."""

    summable = True

    def __init__(self, dtype: torch.dtype = torch.float16) -> None:
        self.dtype = dtype
        self.name = "fp16" if dtype == torch.float16 else "bf16"

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        return [tensor.to(self.dtype)], None

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        return payload[0].to(torch.float32)

    def rounds(self, tensor: torch.Tensor, name: str, world: int,
               shapes: list[torch.Size] | None = None) -> Protocol:
        half = (tensor / world).to(self.dtype)   # step 1-2: pre-divided, no overflow
        sums = yield Round([half])
        total = sums[0].to(torch.float32).mul_(world)
        return Outcome(total, local=lambda: half.to(torch.float32).mul_(world))


@COMPRESSORS.register("fp16", "float16 (2 bytes/element), pre-divided by n; summable")
def _make(**options: str) -> Compressor:
    reject_unknown(options, "compressor 'fp16'")
    return HalfCompressor(torch.float16)
