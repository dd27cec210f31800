"""Choosing one partition type per layer: exact dynamic programming, and brute force.

The cost of an assignment ``t`` of types to layers is ``sum_l U[l, t_l] + sum_e
M_e[t_src(e), t_dst(e)]``: a layer term (compute and intra-layer communication) and one
term per edge (transitions between consecutive layers and residual joins). On a chain this
is AccPar's recurrence (docs/references.md: AccPar)

    cost[l][t] = U[l, t] + min_t' (cost[l-1][t'] + M_(l-1,l)[t', t]),

solved forward and read back by backtracking. A shortcut (ResNet) adds an edge from a layer
further back, so the DP also carries the type of every layer whose output is still needed
by a later edge (the *frontier*). Steps (variable elimination in layer order):

1. keep a table ``C`` over the frontier's types: the cheapest cost of everything decided
   so far, for each combination of frontier types;
2. for layer l: add an axis for t_l, add ``U[l]`` and every edge from a frontier layer into l;
3. every frontier layer (l included) with no edge to a later layer leaves: ``C`` is
   minimised over its axis and the argmin (a table over the remaining axes) is kept;
4. after the last layer ``C`` is a number, the optimum; backtracking reads the argmin
   tables in reverse order of leaving, each indexed by types already fixed.

A chain keeps one layer in the frontier (9 combinations per step, O(L x 9)); a ResNet
block with a projection keeps at most three. Types a scheme does not allow have cost inf.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dlcomm.errors import ConfigError

__all__ = ["Solution", "solve", "assignment_cost", "brute_force", "MAX_FRONTIER"]

MAX_FRONTIER = 8  # 3^8 = 6561 combinations per step


@dataclass(frozen=True)
class Solution:
    cost: float
    types: tuple[int, ...]


def _check(unary: np.ndarray, pairs: Sequence[tuple[int, int]], mats: np.ndarray) -> None:
    n = unary.shape[0]
    if len(pairs) != len(mats):
        raise ValueError("one matrix per edge")
    for u, v in pairs:
        if not (0 <= u < n and 0 <= v < n) or u == v:
            raise ValueError(f"bad edge {(u, v)} for {n} layers")


def solve(unary: np.ndarray, pairs: Sequence[tuple[int, int]], mats: np.ndarray) -> Solution:
    """The cheapest assignment (steps in the module docstring).

    ``unary`` (N, T); ``pairs[e] = (u, v)`` with matrix ``mats[e]`` (T, T) indexed [t_u][t_v].
    """
    unary = np.asarray(unary, dtype=float)
    mats = np.asarray(mats, dtype=float).reshape(len(pairs), unary.shape[1], unary.shape[1])
    _check(unary, pairs, mats)
    n = unary.shape[0]
    into: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
    last_use = list(range(n))
    for (u, v), m in zip(pairs, mats):
        lo, hi, m = (u, v, m) if u < v else (v, u, m.T)
        into[hi].append((lo, m))
        last_use[lo] = max(last_use[lo], hi)

    table = np.zeros(())
    scope: list[int] = []
    eliminated: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    for layer in range(n):
        if len(scope) >= MAX_FRONTIER:
            raise ConfigError(f"the layer graph is too wide to plan exactly: {len(scope)} "
                              f"layers' outputs are pending at layer {layer}")
        table = table[..., None] + unary[layer]
        scope.append(layer)
        for lo, m in into[layer]:
            shape = [1] * len(scope)
            shape[scope.index(lo)] = m.shape[0]
            shape[-1] = m.shape[1]
            table = table + m.reshape(shape)
        for node in [x for x in scope if last_use[x] <= layer]:
            axis = scope.index(node)
            arg = np.argmin(table, axis=axis)
            table = np.take_along_axis(table, np.expand_dims(arg, axis), axis).squeeze(axis)
            scope.pop(axis)
            eliminated.append((node, tuple(scope), arg))
    types = [0] * n
    for node, rest, arg in reversed(eliminated):
        types[node] = int(arg[tuple(types[x] for x in rest)])
    return Solution(float(table), tuple(types))


def assignment_cost(unary: np.ndarray, pairs: Sequence[tuple[int, int]], mats: np.ndarray,
                    types: Sequence[int]) -> float:
    """The cost of one assignment of types (the objective the DP minimises)."""
    unary = np.asarray(unary, dtype=float)
    mats = np.asarray(mats, dtype=float).reshape(len(pairs), unary.shape[1], unary.shape[1])
    total = float(sum(unary[i, t] for i, t in enumerate(types)))
    return total + float(sum(m[types[u], types[v]] for (u, v), m in zip(pairs, mats)))


def brute_force(unary: np.ndarray, pairs: Sequence[tuple[int, int]], mats: np.ndarray,
                limit: int = 12) -> Solution:
    """Enumerate every assignment (T^N of them); the reference the DP is tested against."""
    unary = np.asarray(unary, dtype=float)
    n, t = unary.shape
    if n > limit:
        raise ValueError(f"{t}^{n} assignments is too many to enumerate")
    best = Solution(float("inf"), tuple([0] * n))
    for types in itertools.product(range(t), repeat=n):
        cost = assignment_cost(unary, pairs, mats, types)
        if cost < best.cost:
            best = Solution(cost, types)
    return best
