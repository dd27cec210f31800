"""``compressed``: any exchange wrapped with a Compressor and a Memory (docs/compression.md).

- :mod:`.exchange`: :class:`CompressedExchange` (compress, exchange the payload the method's
  way, decompress, error feedback) and the :class:`Policy` that picks a method per call;
- :mod:`.adaptive`: the adaptive policy (a cost model of each candidate on this network);
- :mod:`.allgather`: exact-size all-gather of payloads that cannot be summed;
- :mod:`.build`: the ``--compress``/``--memory`` specs and the ``compressed:...`` exchange.

``compressed:method=topk,ratio=0.01,memory=residual,over=ring`` wraps the ``over`` exchange
(default ring) with the compressor ``method`` (its options are the remaining keys) and the
memory ``memory`` (default none). This is how commands that take only an exchange spec, such
as ``dlcomm emulate``, reach compression.
"""

from __future__ import annotations

from dlcomm.exchange.base import EXCHANGES, Exchange, ExchangeContext
from dlcomm.exchange.compressed.build import (
    check_specs,
    compressed_exchange,
    compressed_from_options,
)
from dlcomm.exchange.compressed.exchange import CompressedExchange

__all__ = ["CompressedExchange", "compressed_exchange", "check_specs"]


@EXCHANGES.register("compressed", "compression over another exchange: method=SPEC options, "
                    "memory=, over= (docs/compression.md)")
def _make_compressed(ctx: ExchangeContext, **options: str) -> Exchange:
    return compressed_from_options(ctx, dict(options))
