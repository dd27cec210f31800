"""How workers agree on a model: ``--sync bsp | hop:... | prague:... | adpsgd`` (docs/sync.md).

- ``bsp`` (:mod:`.bsp`): the synchronous DDP all-reduce through an exchange (the baseline);
- ``hop:...``: Hop (ASPLOS'19), gossip on a communication graph with update queues and
  token queues that bound the iteration gap, backup workers, staleness, skipping;
- ``prague:...``: Prague (ASPLOS'20), partial all-reduce within groups handed out by a
  group generator (random, static schedule, or a buffer of ready workers);
- ``adpsgd``: AD-PSGD (ICML'18), asynchronous pairwise averaging, active/passive split.

Layout: :mod:`.base` (the registry, the protocol interface, what decentralized protocols
share); the protocols' state machines are pure and tested without processes (graphs.py,
hop.py, prague.py, adpsgd.py, sim.py); the process layer around them is thin (p2p.py,
service.py, preduce.py, run_*.py); recorder.py and evaluation.py are shared. Importing the
package registers every protocol.
"""

from __future__ import annotations

from dlcomm.registry import Spec, parse_spec
from dlcomm.train.sync import bsp as _bsp  # noqa: F401  (registers "bsp")
from dlcomm.train.sync import protocols as _protocols  # noqa: F401  (hop, prague, adpsgd)
from dlcomm.train.sync.base import SYNCS, Decentralized, Protocol

__all__ = ["SYNCS", "Protocol", "Decentralized", "parse_sync", "check_sync"]


def parse_sync(text: str | Spec, world: int | None = None) -> Protocol:
    """The protocol named by ``text``, checked for ``world`` workers if given."""
    spec = text if isinstance(text, Spec) else parse_spec(text)
    options = {k.replace("-", "_"): v for k, v in spec.options.items()}
    protocol = SYNCS.get(spec.name)(**options)
    if world is not None:
        protocol.check(world)
    return protocol


def check_sync(text: str, world: int | None = None) -> None:
    """Raise ConfigError (one line) if ``text`` is not a usable ``--sync`` spec."""
    parse_sync(text, world)
