"""Bandwidth lower bounds of an all-reduce, per exchange (docs/references.md: SwitchML;
collective cost models).

With S bytes per worker and n workers on links of rate B (bit/s, each direction):

- host-based all-reduce (ring): every worker sends and receives 2(n-1)/n * S, so
  T >= 2(n-1)/n * S * 8 / B;
- in-network aggregation (switch): every worker sends S once and receives S once,
  T >= S * 8 / B.

On a two-level tree (racks of h hosts whose uplinks carry U bit/s), a rack-ordered ring
crosses each uplink once per direction, so its links run at min(B, U); with the
aggregation switch at the core, each uplink carries h * S per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlcomm.volume import ring_allreduce_factor

__all__ = ["LinkFacts", "bandwidth_bound_s"]


@dataclass(frozen=True)
class LinkFacts:
    rate_bps: float              # host link rate, each direction
    per_rack: int = 0            # hosts per rack (0: a single switch, no uplinks)
    uplink_bps: float = 0.0      # rack uplink rate, each direction


def bandwidth_bound_s(exchange: str, workers: int, nbytes: float, links: LinkFacts) -> float:
    """Seconds that no implementation of ``exchange`` can beat on ``links``."""
    if workers <= 1:
        return 0.0
    bits = nbytes * 8
    base = exchange.split(":")[0]
    racked = links.per_rack and links.per_rack < workers and links.uplink_bps > 0
    if base in ("switch", "sparse-switch", "auto"):
        bound = bits / links.rate_bps
        if racked:
            bound = max(bound, links.per_rack * bits / links.uplink_bps)
        return bound
    rate = min(links.rate_bps, links.uplink_bps) if racked else links.rate_bps
    return ring_allreduce_factor(workers) * bits / rate
