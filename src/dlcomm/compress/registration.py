"""Registers the ``compressed`` exchange spec in EXCHANGES (imported by dlcomm.exchange).

``compressed:method=topk,ratio=0.01,memory=residual,over=ring`` wraps the ``over`` exchange
(default ring; it takes no options here) with the compressor ``method`` (its options are
the remaining keys) and the memory ``memory`` (default none). This is how commands that take
only an exchange spec, such as ``dlcomm emulate``, reach compression.
"""

from __future__ import annotations

from dlcomm.exchange.base import EXCHANGES, Exchange, ExchangeContext

__all__: list[str] = []


@EXCHANGES.register("compressed", "compression over another exchange: method=SPEC options, "
                    "memory=, over= (docs/compression.md)")
def _make_compressed(ctx: ExchangeContext, **options: str) -> Exchange:
    from dlcomm.compress.api import compressed_from_options
    return compressed_from_options(ctx, dict(options))
