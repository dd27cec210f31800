"""Gradient compression that composes with every exchange (docs/compression.md).

    from dlcomm.compress import compressed_exchange, make_compressor
    exchange = compressed_exchange(make_exchange("ring", ctx), "topk:ratio=0.01", "residual", ctx)

Compressors (one file each, registry :data:`COMPRESSORS`): none, fp16, bf16, topk, randomk,
threshold, dgc, qsgd, terngrad, signsgd, signum, efsignsgd, onebit, natural, powersgd,
u8bit; ``adaptive`` chooses among none/fp16/powersgd/topk per bucket. Memories (error
feedback, :data:`MEMORIES`): none, residual, dgc, powersgd. Attributes load lazily so that
importing the exchange registry stays light.
"""

from typing import Any

__all__ = ["COMPRESSORS", "MEMORIES", "Compressor", "Memory", "CompressedExchange",
           "compressed_exchange", "make_compressor", "make_memory", "run_local", "check_specs"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from dlcomm.compress import api
        return getattr(api, name)
    raise AttributeError(f"module 'dlcomm.compress' has no attribute {name!r}")
