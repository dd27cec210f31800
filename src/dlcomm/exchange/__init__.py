"""Gradient exchanges: one interface, many implementations (see :mod:`dlcomm.exchange.base`)."""

from dlcomm.exchange import ring as _ring  # noqa: F401  (registers "ring")
from dlcomm.exchange import switch as _switch  # noqa: F401  (registers "switch")
from dlcomm.compress import registration as _compressed  # noqa: F401  (registers "compressed")
from dlcomm.exchange.base import (EXCHANGES, Exchange, ExchangeContext, ExchangeStats,
                                  completed_future, make_exchange)
from dlcomm.exchange.hook import ExchangeHookState, exchange_hook

__all__ = ["EXCHANGES", "Exchange", "ExchangeContext", "ExchangeStats", "ExchangeHookState",
           "completed_future", "exchange_hook", "make_exchange"]
