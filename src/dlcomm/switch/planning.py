"""The switch's plan of a sparse round (OmniReduce's look-ahead), as a pure function.

Workers announce their next non-zero block groups (the look-ahead); the switch chooses the
next round's groups from all of them (:func:`plan_round`), so that a round carries the
blocks some worker holds and nothing else (docs/references.md: OmniReduce).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from dlcomm.wire.sparse import popcount, unpack_masks

__all__ = ["Plan", "plan_round"]


class Plan(NamedTuple):
    """A sparse round: its groups (sorted), their agreed exponents, the blocks that will
    arrive in them (the union of the announced masks), and whether the groups are a dense
    run instead."""

    groups: np.ndarray        # int64 (g,)
    exps: np.ndarray          # int64 (g,)
    union: np.ndarray         # bool (g, m)
    run: bool

    @classmethod
    def nothing(cls, m: int) -> Plan:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, m), bool), False)


def plan_round(looks: list[np.ndarray], m: int, capacity: int, lookahead: int) -> Plan:
    """The next sparse round from every worker's look-ahead (pure).

    Each look-ahead row is (group, exponent, block mask words of m bits...), the worker's
    next non-zero groups in order, at most ``lookahead`` of them.

    1. only groups up to the smallest last entry of any full look-ahead may be chosen (a
       worker with a full look-ahead may have more groups beyond its last announced one);
    2. take the smallest announced groups in order, at least one, while the union of the
       workers' blocks in them stays within ``capacity`` blocks, so the result fits one
       datagram (each worker's own blocks are a subset: its contribution fits too);
    3. a group's exponent is the largest announced for it (every worker contributes to
       every round, those without data in its groups with an empty one);
    4. but if the first two or more groups are announced by every worker with every block
       present, plan them as a dense run instead (all of them, one dense round each).
    No groups: nothing is left.
    """
    rows = [(w, look) for w, look in enumerate(looks) if len(look)]
    if not rows:
        return Plan.nothing(m)
    full = [look[-1, 0] for _, look in rows if len(look) >= lookahead]
    cap = min(full) if full else np.iinfo(np.int64).max
    table = np.concatenate([look for _, look in rows])
    table = table[table[:, 0] <= cap]
    table = table[np.argsort(table[:, 0], kind="stable")]
    groups, starts, inverse = np.unique(table[:, 0], return_index=True, return_inverse=True)
    all_exps = np.maximum.reduceat(table[:, 1], starts)
    if len(rows) == len(looks):  # every worker still has data: look for a dense run
        full = popcount(table[:, 2:]) == capacity
        per_group = np.bincount(inverse, weights=full, minlength=len(groups))
        run = int(np.argmin(np.append(per_group == len(looks), False)))
        if run >= 2:
            return Plan(groups[:run], all_exps[:run], np.ones((run, m), bool), True)
    union = np.bitwise_or.reduceat(table[:, 2:], starts, axis=0)
    take = max(1, int(np.searchsorted(np.cumsum(popcount(union)), capacity, side="right")))
    return Plan(groups[:take], all_exps[:take], unpack_masks(union[:take], m), False)
