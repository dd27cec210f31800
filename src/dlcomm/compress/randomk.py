"""``randomk``: k = ceil(ratio * n) elements at indices every worker draws from a shared seed
(Stich et al., NeurIPS'18; Konecny & Richtarik 2018). k is computed exactly on the ratio as
written (0.07 of 100 elements keeps 7), at least 1 and at most n.

1. every worker seeds a generator with (seed, tensor name, call number) and draws the same k
   distinct indices (a random permutation's first k): no indices travel;
2. payload = x[idx] (float32), times n/k when ``scale=1`` so that E[decompress] = x
   (each index is kept with probability k/n);
3. the payloads are aligned, hence summable: one all-reduce of k floats on any exchange;
4. decompress: zeros with the values at idx.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Payload, count_of, fraction
from dlcomm.registry import reject_unknown, take_option

__all__ = ["RandomK", "shared_indices"]


def shared_indices(seed: int, name: str, call: int, n: int, k: int) -> torch.Tensor:
    """k distinct indices in [0, n), the same on every worker for the same arguments."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode()) * 7919
                                         + call) % 2**63)
    return torch.randperm(n, generator=gen)[:k]


class RandomK(Compressor):
    name = "randomk"
    summable = True
    sparse = True

    def __init__(self, ratio: float = 0.01, seed: int = 0, scale: bool = True) -> None:
        self.ratio, self.seed, self.scale = ratio, seed, scale
        self.calls: dict[str, int] = {}

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        n = tensor.numel()
        k = count_of(self.ratio, n)
        call = self.calls.get(name, 0)
        self.calls[name] = call + 1
        idx = shared_indices(self.seed, name, call, n, k)
        values = tensor[idx]
        if self.scale:
            values = values * (n / k)
        return [values], (n, idx)

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        n, idx = ctx
        out = torch.zeros(n, dtype=torch.float32)
        out[idx] = payload[0]
        return out


@COMPRESSORS.register("randomk", "k = ceil(ratio*n) elements (exact) at shared random indices, "
                      "scaled n/k "
                      "(ratio=0.01, scale=1, seed=0); summable")
def _make(**options: str) -> Compressor:
    owner = "compressor 'randomk'"
    ratio = take_option(options, "ratio", float, 0.01, owner, fraction, "0 < ratio <= 1")
    seed = take_option(options, "seed", int, 0, owner)
    scale = take_option(options, "scale", int, 1, owner, lambda v: v in (0, 1), "0 or 1")
    reject_unknown(options, owner)
    return RandomK(ratio, seed, bool(scale))
