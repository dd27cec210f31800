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

import numpy as np
import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Payload
from dlcomm.compress.quantizer import uniforms
from dlcomm.registry import reject_unknown, take_option

__all__ = ["Natural"]

SPAN = 126  # exponents below the top that a code can name


class Natural(Compressor):
    name = "natural"
    fixed_size = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def bind(self, rank: int, world: int) -> None:
        self.rng = np.random.default_rng([self.seed, rank])

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        n = tensor.numel()
        bits = tensor.contiguous().view(torch.int32)
        expo = (bits >> 23) & 0xFF                 # biased exponent; 0: zero or subnormal
        if n == 0 or int(expo.max()) == 0:
            return [torch.zeros(n, dtype=torch.uint8), torch.zeros(1, dtype=torch.int32)], n
        a = expo - 127                             # floor(log2 |x|) of a normal x
        top = int(expo.max()) - 126                # floor(log2 max|x|) + 1
        floor_e = top - SPAN
        frac = (bits & 0x7FFFFF).to(torch.float32).mul_(2.0 ** -23)  # (|x| - 2^a) / 2^a
        e = a + (uniforms(n, self.rng) < frac).to(torch.int32)       # the chosen exponent
        zero = expo == 0
        small = torch.nonzero((a < floor_e) | zero, as_tuple=True)[0]
        if small.numel():  # 0 or 2^floor_e with probability |x| / 2^floor_e (float64)
            mags = tensor[small].abs().double()
            p = mags / 2.0 ** floor_e
            up = torch.from_numpy(self.rng.random(small.numel())) < p
            e[small] = floor_e
            zero = zero.clone()
            zero[small] = ~up
        code = (top - e + 1).clamp_(1, SPAN + 1).to(torch.uint8)
        code[zero] = 0
        code |= (bits < 0).to(torch.uint8) << 7
        return [code, torch.tensor([top], dtype=torch.int32)], n

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        code, top = payload
        offset = (code & 127).to(torch.int32)
        mags = torch.ldexp(torch.ones(offset.shape), int(top[0]) - offset + 1)
        mags[offset == 0] = 0.0
        return torch.where(code >= 128, -mags, mags)


@COMPRESSORS.register("natural", "natural compression: unbiased rounding to powers of two "
                      "(1 byte/element)")
def _make(**options: str) -> Compressor:
    seed = take_option(options, "seed", int, 0, "compressor 'natural'")
    reject_unknown(options, "compressor 'natural'")
    return Natural(seed)
