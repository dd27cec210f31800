"""Shared form of the sparsifiers (topk, threshold, dgc): (values, indices) payloads.

A payload is ``[values (float32, k), indices (int32, k)]``: 8 bytes per kept element. It is
not summable (each worker keeps different indices), so it is all-gathered; peers' payloads
are scatter-added into one dense tensor (no n dense copies), or, on a sparse exchange, the
dense tensor with zeros elsewhere is summed by the exchange.
"""

from __future__ import annotations

from typing import Any

import torch

from dlcomm.compress.base import Compressor, Payload

__all__ = ["Sparsifier", "sparse_payload"]


def sparse_payload(tensor: torch.Tensor, indices: torch.Tensor) -> Payload:
    """The (values, indices) payload of ``tensor`` at ``indices``."""
    indices = indices.to(torch.int64)
    return [tensor[indices], indices.to(torch.int32)]


class Sparsifier(Compressor):
    """Base of methods that send a subset of the elements with their indices."""

    sparse = True

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        out = torch.zeros(ctx, dtype=torch.float32)
        self.decompress_add(payload, ctx, out)
        return out

    def decompress_add(self, payload: Payload, ctx: Any, out: torch.Tensor) -> None:
        values, indices = payload
        out.index_add_(0, indices.to(torch.int64), values)
