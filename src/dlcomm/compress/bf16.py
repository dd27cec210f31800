"""``bf16``: bfloat16 (8 exponent bits like float32, 8 significant bits): 2 bytes per element.

The same steps as ``fp16`` (pre-divide by n, cast, sum, cast back, multiply by n); bfloat16
keeps float32's range, so nothing overflows or underflows, at 3 fewer bits of precision.
"""

from __future__ import annotations

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor
from dlcomm.compress.fp16 import HalfCompressor
from dlcomm.registry import reject_unknown

__all__: list[str] = []


@COMPRESSORS.register("bf16", "bfloat16 (2 bytes/element), pre-divided by n; summable")
def _make(**options: str) -> Compressor:
    reject_unknown(options, "compressor 'bf16'")
    return HalfCompressor(torch.bfloat16)
