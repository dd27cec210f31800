"""``dgc``: Deep Gradient Compression's sparsifier (Lin et al., ICLR'18, section 3 and
"implementation details"): top-k by a threshold estimated from a sample.

1. sample s = max(min_sample, sample * n) elements at random (a seeded generator);
2. tau = the ceil(ratio * s)-th largest |x| of the sample: an estimate of the top-ratio
   threshold at the cost of a small top-k;
3. idx = {i : |x_i| >= tau};
4. hierarchical selection: if more than 1.3 k = 1.3 ceil(ratio * n) passed, keep the exact
   top k among them; if none passed, keep the single largest;
5. payload = (x[idx], idx), as topk (variable length).

Counts (k, s and the sample's top count) are ceil(fraction x n) computed exactly on the
fraction as written (``compress.base.count_of``: 0.07 of 100 is 7).

DGC's momentum correction and factor masking are the ``dgc`` memory (memory.py); DGC's
warm-up (exponentially rising sparsity) and local gradient clipping are left to the caller.
"""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Payload, count_of, fraction
from dlcomm.compress.sparse import Sparsifier, sparse_payload
from dlcomm.compress.topk import topk_indices
from dlcomm.registry import reject_unknown, take_option

__all__ = ["DGC"]

MIN_SAMPLE = 1000
OVERSHOOT = 1.3


class DGC(Sparsifier):
    name = "dgc"

    def __init__(self, ratio: float = 0.01, sample: float = 0.01, seed: int = 0) -> None:
        self.ratio, self.sample = ratio, sample
        self.gen = torch.Generator().manual_seed(seed)

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        n = tensor.numel()
        k = count_of(self.ratio, n)
        s = min(n, max(MIN_SAMPLE, count_of(self.sample, n)))
        picks = torch.randint(0, n, (s,), generator=self.gen) if s < n else None
        sampled = tensor[picks].abs() if picks is not None else tensor.abs()
        tau = torch.topk(sampled, count_of(self.ratio, s), sorted=False).values.min()
        idx = torch.nonzero(tensor.abs() >= tau, as_tuple=True)[0]
        if idx.numel() > OVERSHOOT * k:
            idx = idx[topk_indices(tensor[idx], k)]
        elif idx.numel() == 0:
            idx = topk_indices(tensor, 1)
        return sparse_payload(tensor, idx), n


@COMPRESSORS.register("dgc", "DGC: top-ratio by a sampled threshold (ratio=0.01, sample=0.01; "
                      "counts are ceil(ratio*n), exact)")
def _make(**options: str) -> Compressor:
    owner = "compressor 'dgc'"
    ratio = take_option(options, "ratio", float, 0.01, owner, fraction, "0 < ratio <= 1")
    sample = take_option(options, "sample", float, 0.01, owner, fraction, "0 < sample <= 1")
    seed = take_option(options, "seed", int, 0, owner)
    reject_unknown(options, owner)
    return DGC(ratio, sample, seed)
