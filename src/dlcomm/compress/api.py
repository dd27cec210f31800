"""The public face of dlcomm.compress: build compressors and memories, try them locally.

Compressed *exchanges* (a compressor and a memory around any exchange) live in
:mod:`dlcomm.exchange.compressed`; this package knows nothing of exchanges.
"""

from __future__ import annotations

import torch

from dlcomm.compress import (  # noqa: F401
    bf16,
    dgc,
    efsignsgd,
    fp16,
    natural,
    none,
    onebit,
    powersgd,
    qsgd,
    randomk,
    signsgd,
    signum,
    terngrad,
    threshold,
    topk,
    u8bit,
)
from dlcomm.compress import memory as _memory  # noqa: F401  (registers the memories)
from dlcomm.compress.base import COMPRESSORS, MEMORIES, Compressor, Memory, Payload
from dlcomm.compress.packing import encode_payload, lanes_per_word
from dlcomm.errors import ConfigError
from dlcomm.registry import Spec, parse_spec

__all__ = ["COMPRESSORS", "MEMORIES", "Compressor", "Memory", "make_compressor", "make_memory",
           "run_local", "wire_bytes"]


def make_compressor(spec: str | Spec) -> Compressor:
    """Build the compressor named by ``spec`` (``topk:ratio=0.01``, ``powersgd:rank=4``)."""
    parsed = spec if isinstance(spec, Spec) else parse_spec(spec)
    if parsed.name == "adaptive":
        raise ConfigError("'adaptive' chooses compressors per bucket inside an exchange; use "
                          "dlcomm.exchange.compressed.compressed_exchange(..., 'adaptive', ...)")
    return COMPRESSORS.get(parsed.name)(**dict(parsed.options))


def make_memory(spec: str | Spec) -> Memory:
    """Build the error-feedback memory named by ``spec`` (``residual``, ``dgc:momentum=0.9``)."""
    parsed = spec if isinstance(spec, Spec) else parse_spec(spec)
    return MEMORIES.get(parsed.name)(**dict(parsed.options))


def wire_bytes(compressor: Compressor, payload: Payload, world: int, native: bool) -> int:
    """Bytes one worker puts into its collective for ``payload`` (before the collective's
    own factor: 2(n-1)/n for a ring all-reduce, n-1 for an all-gather)."""
    if not compressor.summable:
        return encode_payload(payload).numel()
    levels = compressor.payload_levels()
    total = 0
    for t in payload:
        if t.dtype.is_floating_point:
            wide = t.dtype == torch.float32 or not native
            total += t.numel() * (4 if wide else 2)
        elif levels is not None:
            lanes = lanes_per_word(levels, world, torch.int32 if native else torch.float32)
            total += -(-t.numel() // lanes) * 4
    return total


def run_local(compressor: Compressor, tensor: torch.Tensor, name: str = "t"
              ) -> tuple[torch.Tensor, Payload]:
    """Compress and decompress on one worker (GRACE's interface): (approximation, payload)."""
    payload, ctx = compressor.compress(tensor, name)
    return compressor.decompress(payload, ctx), payload
