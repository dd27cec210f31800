"""``signum``: signSGD with momentum, majority vote (Bernstein et al., ICML'18 section 3;
"signSGD with majority vote", ICLR'19, Algorithm 1 with momentum).

1. per tensor, the local momentum m <- beta m + (1 - beta) x (kept on this worker);
2. payload = sign(m), one bit per element;
3. all-gather, majority vote sign(sum_w sign(m_w)), as ``signsgd``.
"""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Payload
from dlcomm.compress.signsgd import SignSGD
from dlcomm.registry import reject_unknown, take_option

__all__ = ["Signum"]


class Signum(SignSGD):
    name = "signum"

    def __init__(self, momentum: float = 0.9) -> None:
        self.momentum = momentum
        self.state: dict[str, torch.Tensor] = {}

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        m = self.state.get(name)
        if m is None or m.numel() != tensor.numel():
            m = self.state[name] = torch.zeros_like(tensor)
        m.mul_(self.momentum).add_(tensor, alpha=1 - self.momentum)
        return super().compress(m, name)

    def reset(self) -> None:
        self.state.clear()


@COMPRESSORS.register("signum", "signs of local momentum, majority vote (momentum=0.9)")
def _make(**options: str) -> Compressor:
    momentum = take_option(options, "momentum", float, 0.9, "compressor 'signum'",
                      lambda v: 0 <= v < 1, "0 <= momentum < 1")
    reject_unknown(options, "compressor 'signum'")
    return Signum(momentum)
