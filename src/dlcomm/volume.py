"""Bytes that one worker moves in the collectives dlcomm runs and models.

The one home of these formulas (the ring exchange, the compressed exchange, bandwidth
bounds, Prague's partial all-reduce and the planner all use them). With S bytes per
worker and n workers (docs/references.md: collective cost models):

- ring all-reduce (reduce-scatter then all-gather, as gloo runs large tensors): every worker
  sends and receives ``2 (n - 1) / n x S``;
- in-network aggregation: every worker sends S once and receives S once.
"""

from __future__ import annotations

__all__ = ["ring_allreduce_factor", "ring_allreduce_bytes"]


def ring_allreduce_factor(workers: int) -> float:
    """2 (n - 1) / n: the share of the tensor each worker sends in a ring all-reduce."""
    return 2 * (workers - 1) / workers if workers > 1 else 0.0


def ring_allreduce_bytes(nbytes: int, workers: int) -> int:
    """Whole bytes each worker sends (and receives) in a ring all-reduce of ``nbytes``."""
    return 2 * (workers - 1) * nbytes // workers if workers > 1 else 0
