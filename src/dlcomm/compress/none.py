"""``none``: the identity; the baseline every method is compared with (GRACE,
docs/references.md)."""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Outcome, Payload, Protocol, Round
from dlcomm.registry import reject_unknown

__all__ = ["NoCompression"]


class NoCompression(Compressor):
    """Send the float32 tensor as it is: 4 bytes per element, summed by the exchange."""

    name = "none"
    summable = True
    lossless = True

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        return [tensor], None

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        return payload[0]

    def rounds(self, tensor: torch.Tensor, name: str, world: int,
               shapes: list[torch.Size] | None = None) -> Protocol:
        (total,) = yield Round([tensor], inplace=True)  # summed in place, no copy
        return Outcome(total, exact=True)


@COMPRESSORS.register("none", "no compression: float32, summed by the exchange")
def _make(**options: str) -> Compressor:
    reject_unknown(options, "compressor 'none'")
    return NoCompression()
