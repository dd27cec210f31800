"""Gradient exchanges: one interface, many implementations (see :mod:`dlcomm.exchange.base`).

Importing the package registers every exchange in :data:`EXCHANGES`: ``ring`` (torch's
all-reduce), ``switch``/``sparse-switch``/``auto`` (the aggregation switch's client) and
``compressed`` (any of them wrapped with a compressor and a memory).
"""

from dlcomm.exchange import compressed as _compressed  # noqa: F401  (registers "compressed")
from dlcomm.exchange import ring as _ring  # noqa: F401  (registers "ring")
from dlcomm.exchange import switch as _switch  # noqa: F401  (registers "switch", ...)
from dlcomm.exchange.base import (
                                  EXCHANGES,
                                  Exchange,
                                  ExchangeContext,
                                  ExchangeStats,
                                  completed_future,
                                  make_exchange,
)
from dlcomm.exchange.hook import ExchangeHookState, exchange_hook

__all__ = ["EXCHANGES", "Exchange", "ExchangeContext", "ExchangeStats", "ExchangeHookState",
           "completed_future", "exchange_hook", "make_exchange"]
