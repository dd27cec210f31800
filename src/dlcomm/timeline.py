"""The pipeline of an iteration's gradient buckets, pure and dependency-free.

Backward hands over each bucket when it is ready; one exchange runs them in order, each
starting at max(its ready time, the previous one's end). ``dlcomm advise``
(:mod:`dlcomm.advise.cost`) and ``--compress adaptive``
(:mod:`dlcomm.exchange.compressed.assign`) price iterations with it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["finish_time"]


def finish_time(ready: Sequence[float], durations: Sequence[float]) -> float:
    """When the last bucket is done: each starts at max(its ready time, the previous end)."""
    t = 0.0
    for s, c in zip(ready, durations):
        t = max(s, t) + c
    return t
