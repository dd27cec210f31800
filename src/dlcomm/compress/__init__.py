"""Gradient compression: pure methods, error-feedback memories and wire packing.

    from dlcomm.compress import make_compressor, run_local
    approx, payload = run_local(make_compressor("topk:ratio=0.01"), tensor)

Compressors (one file each, registry :data:`COMPRESSORS`): none, fp16, bf16, topk, randomk,
threshold, dgc, qsgd, terngrad, signsgd, signum, efsignsgd, onebit, natural, powersgd,
u8bit. Memories (error feedback, :data:`MEMORIES`): none, residual, dgc, powersgd. Nothing
here imports an exchange: :mod:`dlcomm.exchange.compressed` wraps any exchange with them
(docs/compression.md). Attributes load lazily so that importing a method stays light.
"""

from typing import Any

__all__ = ["COMPRESSORS", "MEMORIES", "Compressor", "Memory", "make_compressor", "make_memory",
           "run_local", "wire_bytes"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from dlcomm.compress import api
        return getattr(api, name)
    raise AttributeError(f"module 'dlcomm.compress' has no attribute {name!r}")
