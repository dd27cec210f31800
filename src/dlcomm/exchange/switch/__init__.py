"""The client of dlcomm's aggregation switch: exchanges ``switch``, ``sparse-switch``, ``auto``.

- :mod:`.spec`: the specs' options, parsed and checked;
- :mod:`.bootstrap`: sockets, registration on every shard, multicast groups;
- :mod:`.window`, :mod:`.sparse_window`: the worker's protocol as pure state machines;
- :mod:`.transport`: one UDP socket and one I/O thread that run them;
- :mod:`.exchange`: :class:`SwitchExchange`, the :class:`~dlcomm.exchange.base.Exchange`.

From the bootstrap on, gradients move only through the switch; a rank whose control
connection drops makes the others fail at once, naming it (docs/switch.md).
"""

from __future__ import annotations

from collections.abc import Callable

from dlcomm.exchange.base import EXCHANGES, Exchange, ExchangeContext
from dlcomm.exchange.switch.exchange import SwitchExchange, auto_sparse_below
from dlcomm.exchange.switch.spec import SWITCH_ENV, parse_switch_spec

__all__ = ["SwitchExchange", "SWITCH_ENV", "auto_sparse_below"]


def _factory(mode: str) -> Callable[..., Exchange]:
    def make(ctx: ExchangeContext, **options: str) -> Exchange:
        return SwitchExchange(ctx, parse_switch_spec(mode, options))
    return make


EXCHANGES.register("switch", "in-network aggregation through dlcomm's switch (SwitchML)")(
    _factory("dense"))
EXCHANGES.register("sparse-switch", "only non-zero blocks through the switch (OmniReduce)")(
    _factory("sparse"))
EXCHANGES.register("auto", "dense or sparse switch rounds per tensor, from its density")(
    _factory("auto"))
