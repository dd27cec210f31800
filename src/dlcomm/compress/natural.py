"""``natural``: natural compression (Horvath et al., "Natural Compression for Distributed
Deep Learning", 2019, section 2): stochastic rounding to a power of two.

For |x| in [2^a, 2^(a+1)): round to 2^(a+1) with probability p = (|x| - 2^a) / 2^a, else
to 2^a; E = 2^a (1 - p) + 2^(a+1) p = |x| (unbiased), variance <= |x|^2 / 8.

Wire form: one byte per element, sign in bit 7 and the exponent in bits 0-6 as an offset
c + 1 (c in 0..126) below ``top`` (= floor(log2 max|x|) + 1, sent as 4 bytes), code 0 for
zero. Magnitudes below 2^(top-126) round to 0 or 2^(top-126), still unbiased. Not summable
(a sum of powers of two is not one): all-gathered, decompressed and added.
"""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Payload, option, reject_unknown

__all__ = ["Natural"]

SPAN = 126  # exponents below the top that a code can name


class Natural(Compressor):
    name = "natural"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.gen = torch.Generator().manual_seed(seed)

    def bind(self, rank: int, world: int) -> None:
        self.gen.manual_seed(self.seed * 65_537 + rank)

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        ax = tensor.abs()
        peak = float(ax.max()) if ax.numel() else 0.0
        if peak == 0.0:
            return [torch.zeros(tensor.numel(), dtype=torch.uint8),
                    torch.zeros(1, dtype=torch.int32)], tensor.numel()
        top = int(torch.frexp(torch.tensor(peak)).exponent)  # floor(log2 peak) + 1
        floor_e = top - SPAN
        a = torch.frexp(ax).exponent - 1                      # floor(log2 |x|) (x != 0)
        a.clamp_(min=floor_e - 1)
        low = torch.ldexp(torch.ones_like(ax), a)             # 2^a, or 2^(floor_e - 1)
        u = torch.rand(ax.shape, generator=self.gen)
        small = a < floor_e                                   # round to 0 or 2^floor_e
        p_up = torch.where(small, ax / (2 * low), (ax - low) / low)
        e = a + (u < p_up).to(a.dtype)                        # chosen exponent
        zero = (ax == 0) | (small & (e < floor_e))
        code = (top - e + 1).clamp_(1, SPAN + 1).to(torch.uint8)
        code[zero] = 0
        code |= (tensor < 0).to(torch.uint8) << 7
        return [code, torch.tensor([top], dtype=torch.int32)], tensor.numel()

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        code, top = payload
        offset = (code & 127).to(torch.int32)
        mags = torch.ldexp(torch.ones(offset.shape), int(top[0]) - offset + 1)
        mags[offset == 0] = 0.0
        return torch.where(code >= 128, -mags, mags)


@COMPRESSORS.register("natural", "natural compression: unbiased rounding to powers of two "
                      "(1 byte/element)")
def _make(**options: str) -> Compressor:
    seed = option(options, "seed", int, 0, "compressor 'natural'")
    reject_unknown(options, "compressor 'natural'")
    return Natural(seed)
