"""Alpha-beta cost models of collectives, as pure functions (docs/references.md:
collective cost models).

Every function returns seconds for ``p`` ranks and a message of ``n`` bytes per rank, with
``alpha`` the per-message latency (s), ``beta`` the time per byte on the link a rank uses
(s/B, i.e. 1 / bandwidth) and ``gamma`` the time per byte of a reduction (s/B, default 0):

- ring:                 2(p-1) a + 2(p-1)/p n b (+ (p-1)/p n g)
- recursive doubling:   log2(p) (a + n b (+ n g))
- Rabenseifner:         2 log2(p) a + 2(p-1)/p n b (+ (p-1)/p n g)
- binomial tree:        2 log2(p) (a + n b)            (reduce, then broadcast)
- torus rings:          2(p1+...+pd - d) a + 2(P-1)/P n b / k    (P = p1...pd, k rings)
- hierarchical:         ring on n over g ranks per node, then ring on n/g over the nodes
- all-to-all:           (p-1) a + (p-1)/p n b (pairwise); bounds (p-1)/p n / B_inj and
                        (p n / 4) / B_bisection
- in-network aggregation: T ~ n / B: each rank sends n once and receives n once
  (docs/references.md: SwitchML), plus the latency of the switch levels.

The planner (``dlcomm.plan.bandwidth``, ``dlcomm.plan.commtime``) and the simulator call
these directly; ``bus_bandwidth`` turns a time into NCCL's "bus bandwidth" convention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dlcomm.volume import ring_allreduce_factor

__all__ = ["ring_allreduce", "ring_reduce_scatter", "ring_allgather",
           "recursive_doubling_allreduce", "rabenseifner_allreduce", "rabenseifner_steps",
           "binomial_allreduce", "torus_allreduce", "hierarchical_allreduce",
           "alltoall_pairwise", "alltoall_lower_bound", "ina_allreduce", "p2p",
           "bus_bandwidth", "log2_steps"]


def _check(p: int, n: float) -> None:
    if p < 1:
        raise ValueError(f"a collective needs at least one rank, got p={p}")
    if n < 0:
        raise ValueError(f"message size must be >= 0, got n={n}")


def log2_steps(p: int) -> int:
    """Rounds of a doubling algorithm over ``p`` ranks: ceil(log2 p)."""
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def ring_reduce_scatter(p: int, n: float, alpha: float, beta: float,
                        gamma: float = 0.0) -> float:
    """Ring reduce-scatter: (p-1) steps of n/p bytes each."""
    _check(p, n)
    return (p - 1) * alpha + (p - 1) / p * n * (beta + gamma)


def ring_allgather(p: int, n: float, alpha: float, beta: float) -> float:
    """Ring all-gather of a result of n bytes: (p-1) steps of n/p bytes each."""
    _check(p, n)
    return (p - 1) * alpha + (p - 1) / p * n * beta


def ring_allreduce(p: int, n: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Ring all-reduce = ring reduce-scatter + ring all-gather: 2(p-1)a + 2(p-1)/p n b."""
    return ring_reduce_scatter(p, n, alpha, beta, gamma) + ring_allgather(p, n, alpha, beta)


def recursive_doubling_allreduce(p: int, n: float, alpha: float, beta: float,
                                 gamma: float = 0.0) -> float:
    """Recursive doubling: log2(p) rounds, each exchanging (and reducing) all n bytes."""
    _check(p, n)
    return log2_steps(p) * (alpha + n * (beta + gamma))


def rabenseifner_allreduce(p: int, n: float, alpha: float, beta: float,
                           gamma: float = 0.0) -> float:
    """Recursive halving reduce-scatter + recursive doubling all-gather (Rabenseifner).

    2 log2(p) a + 2(p-1)/p n b + (p-1)/p n g; exact for p a power of two.
    """
    _check(p, n)
    return 2 * log2_steps(p) * alpha + (p - 1) / p * n * (2 * beta + gamma)


def rabenseifner_steps(p: int, n: float, alpha: float, betas: Sequence[float]) -> float:
    """Rabenseifner with a different beta per round (contention differs by partner distance).

    Round s (s = 1..log2 p) of the reduce-scatter exchanges n / 2^s bytes; the all-gather
    repeats the rounds in reverse order with the same sizes. ``betas[s-1]`` is the time per
    byte in round s.
    """
    _check(p, n)
    steps = log2_steps(p)
    if len(betas) != steps:
        raise ValueError(f"need {steps} betas for p={p}, got {len(betas)}")
    return 2 * sum(alpha + n / 2 ** (s + 1) * b for s, b in enumerate(betas))


def binomial_allreduce(p: int, n: float, alpha: float, beta: float) -> float:
    """Binomial-tree reduce followed by a binomial-tree broadcast: 2 log2(p)(a + n b)."""
    _check(p, n)
    return 2 * log2_steps(p) * (alpha + n * beta)


def torus_allreduce(dims: Sequence[int], n: float, alpha: float, beta: float,
                    rings: int = 1) -> float:
    """Ring all-reduce dimension by dimension on a p1 x ... x pd torus (or grid of rings).

    Reduce-scatter along dimension 1 on n, along dimension 2 on n/p1, ...; then all-gather
    in reverse. Latency 2(p1+...+pd - d) a; bandwidth 2(P-1)/P n b; ``rings`` disjoint
    rings (e.g. both directions of every dimension, concurrently on slices of the data)
    divide the bandwidth term by ``rings``.
    """
    dims = [d for d in dims if d > 1]
    total = math.prod(dims) if dims else 1
    _check(total, n)
    if rings < 1:
        raise ValueError(f"rings must be >= 1, got {rings}")
    return (2 * (sum(dims) - len(dims)) * alpha
            + ring_allreduce_factor(total) * n * beta / rings)


def hierarchical_allreduce(g: int, nodes: int, n: float, alpha: float, beta_intra: float,
                           beta_inter: float, alpha_inter: float | None = None) -> float:
    """g ranks per node, ``nodes`` nodes: intra-node ring on n (reduce-scatter, then
    all-gather) around g concurrent inter-node ring all-reduces on n/g each."""
    _check(g * nodes, n)
    a_inter = alpha if alpha_inter is None else alpha_inter
    return (ring_allreduce(g, n, alpha, beta_intra)
            + ring_allreduce(nodes, n / g, a_inter, beta_inter))


def alltoall_pairwise(p: int, n: float, alpha: float, beta: float) -> float:
    """Pairwise-exchange all-to-all: each rank holds n bytes, n/p for every rank;
    p-1 rounds of n/p bytes: (p-1) a + (p-1)/p n b."""
    _check(p, n)
    return (p - 1) * alpha + (p - 1) / p * n * beta


def alltoall_lower_bound(p: int, n: float, injection_Bps: float,
                         bisection_Bps: float) -> float:
    """No all-to-all beats max((p-1)/p n / B_injection, (p n / 4) / B_bisection).

    Each rank must send (p-1)/p of its n bytes through its own injection bandwidth; across
    a bisection, half the ranks send half of their data to the other half: p/2 * n/2.
    Bandwidths in bytes per second.
    """
    _check(p, n)
    return max((p - 1) / p * n / injection_Bps, (p * n / 4) / bisection_Bps)


def ina_allreduce(n: float, alpha: float, beta: float, levels: int = 1) -> float:
    """In-network aggregation: each rank streams n bytes up and receives n bytes of result
    concurrently (T ~ n b), plus one latency per switch level up and down."""
    _check(1, n)
    return 2 * levels * alpha + n * beta


def p2p(n: float, alpha: float, beta: float) -> float:
    """One point-to-point message: a + n b."""
    _check(1, n)
    return alpha + n * beta


def bus_bandwidth(p: int, n: float, seconds: float) -> float:
    """NCCL's bus bandwidth of an all-reduce: 2(p-1)/p * n / T (bytes/s).

    It equals the link bandwidth for an optimal ring, so algorithms and networks compare
    on one scale; in-network aggregation can exceed it (up to ~2x).
    """
    if seconds <= 0:
        return math.inf
    return ring_allreduce_factor(p) * n / seconds
