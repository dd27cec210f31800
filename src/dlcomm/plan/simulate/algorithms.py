"""Collectives decomposed into flows: the phases each algorithm runs over a group of g ranks.

A :class:`Phase` is one communication pattern of an algorithm, run ``steps`` times: a set
of flows between group members (``src[f] -> dst[f]``, member indices 0..g-1; ``SWITCH``
stands for the aggregating switch) with relative ``weight`` s. Over the whole phase a
flow of weight w carries ``w * fraction * n`` bytes, where n is the collective's message
size per rank. Every step pays one message latency. Phases run one after another.

Algorithms (docs/references.md: collective cost models; the closed forms of
``dlcomm.plan.collectives`` are what these phases give on a non-blocking network, which the
tests check):

- ``ring``: reduce-scatter + all-gather around the ring, split over both directions
  (each rank sends to i+1 and i-1, half of the data each): 2(g-1) steps, each flow carries
  (g-1)/g n in all; on links of rate B: 2(g-1)/g n / B.
- ``tree``: binomial reduce then broadcast: 2 ceil(log2 g) phases of one step; in round s
  ranks i with i mod 2^(s+1) = 2^s send all n bytes to i - 2^s (reversed to broadcast).
- ``halving-doubling`` (Rabenseifner; g a power of two): reduce-scatter by recursive
  halving, partner i XOR 2^s carrying n / 2^(s+1), then the all-gather by recursive
  doubling in reverse order; ``doubling``: recursive doubling, every round all n bytes.
- ``torus``: the group as a grid (its members' places on a torus or HammingMesh when
  they form one, else g1 x g2 in rank order, g1 the largest divisor <= sqrt g) with rings
  in both directions of every dimension at once, each on a 1/(2d) share of the data:
  2 sum(g_i - 1) steps, each flow 2(g-1)/g n / (2d) (``torus_allreduce`` with 2d rings).
- ``hierarchical:h``: ring reduce-scatter inside blocks of h consecutive members, ring
  all-reduce of n/h across blocks among members of the same position, ring all-gather
  inside blocks (``hierarchical_allreduce``).
- ``rails:h`` (NCCL's rings on nodes of h GPUs, one NIC each): h rings over all members,
  each on 1/h of the data, entering and leaving every block of h consecutive members
  through a different member; so per member (h-1)/h of the ring traffic stays inside its
  block and 1/h crosses to the same position of the next block: one phase, 2(g-1) steps,
  bus bandwidth min(B_in h/(h-1), h B_out) on nodes with B_in inside and B_out per NIC
  (one block: a plain ring);
- ``ina``: in-network aggregation (SwitchML): each member streams n to the switch, which
  returns the sum: one up and one down flow per member (weights: the fraction of the
  message each carries, < 1 for sparse streams).
- ``allgather``: bidirectional ring all-gather of a payload of n per member:
  (g-1) steps, each flow (g-1) n / 2.
- ``alltoall``: pairwise exchange, n/g to every other member: g-1 steps; above
  ``max_flows`` flows per group a fixed sample of partner offsets stands for all, each
  sampled flow weighted (g-1)/k, so every member's own links keep their exact load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan.collectives import log2_steps
from dlcomm.volume import ring_allreduce_factor

__all__ = ["SWITCH", "Phase", "ALLREDUCE", "allreduce_phases", "ina_phases",
           "allgather_phases", "alltoall_phases", "grid_shape", "hierarchy_sizes"]

SWITCH = -1     # member index that stands for the aggregating switch


@dataclass(frozen=True, eq=False)
class Phase:
    key: str               # the pattern's name inside a group, e.g. "hd:s=2"
    src: np.ndarray        # member index per flow (SWITCH for the switch)
    dst: np.ndarray
    weight: np.ndarray     # relative bytes of each flow
    fraction: float        # bytes carried by a weight-1 flow = fraction x n
    steps: int             # message rounds (each pays the latency)


def _phase(key: str, src: np.ndarray, dst: np.ndarray, fraction: float, steps: int,
           weight: np.ndarray | None = None) -> Phase:
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    w = np.ones(len(src)) if weight is None else np.asarray(weight, dtype=float)
    return Phase(key, src, dst, w, float(fraction), int(steps))


def _ring(key: str, members: np.ndarray, fraction: float, steps: int) -> Phase:
    """Both directions of a ring over ``members`` (one row per ring)."""
    members = np.atleast_2d(members)
    src = np.concatenate([members.ravel(), members.ravel()])
    dst = np.concatenate([np.roll(members, -1, 1).ravel(), np.roll(members, 1, 1).ravel()])
    return _phase(key, src, dst, fraction, steps)


def grid_shape(g: int) -> tuple[int, int]:
    """(g1, g2) with g1 the largest divisor of g not above sqrt(g)."""
    g1 = max(d for d in range(1, math.isqrt(g) + 1) if g % d == 0)
    return g1, g // g1


def hierarchy_sizes(g: int) -> list[int]:
    """Block sizes h tried by the hierarchical all-reduce: 2, 4, 8 where they divide g
    and leave at least two blocks."""
    return [h for h in (2, 4, 8) if g % h == 0 and g // h >= 2]


def _ring_phases(g: int) -> list[Phase]:
    return [_ring("ring", np.arange(g), (g - 1) / g, 2 * (g - 1))]


def _tree_phases(g: int) -> list[Phase]:
    up = []
    for s in range(log2_steps(g)):
        i = np.arange(g)
        send = i[(i % 2 ** (s + 1)) == 2 ** s]
        up.append(_phase(f"tree-up:s={s}", send, send - 2 ** s, 1.0, 1))
    down = [_phase(p.key.replace("up", "down"), p.dst, p.src, 1.0, 1) for p in reversed(up)]
    return up + down


def _xor_rounds(g: int, name: str, halving: bool) -> list[Phase]:
    if g & (g - 1):
        raise ConfigError(f"{name} needs a power-of-two group, got {g} ranks")
    i = np.arange(g)
    rounds = [_phase(f"xor:s={s}", i, i ^ (1 << s), 1 / 2 ** (s + 1) if halving else 1.0, 1)
              for s in range(log2_steps(g))]
    return rounds + list(reversed(rounds)) if halving else rounds


def _torus_phases(g: int, layout: np.ndarray | None = None) -> list[Phase]:
    if layout is None:
        g1, g2 = grid_shape(g)
        if g1 < 2:
            raise ConfigError(f"the torus all-reduce needs a group that factors, got {g} "
                              "ranks")
        layout = np.arange(g).reshape(g2, g1)
    layout = np.asarray(layout).squeeze()
    axes = [ax for ax in range(layout.ndim) if layout.shape[ax] > 1]
    if layout.size != g or len(axes) < 2:
        raise ConfigError(f"the torus all-reduce needs a grid of at least 2 x 2 ranks, got "
                          f"{'x'.join(map(str, layout.shape))}")
    flat = layout.ravel()
    dst = np.concatenate([np.roll(layout, s, ax).ravel() for ax in axes for s in (-1, 1)])
    shape = "x".join(str(layout.shape[ax]) for ax in axes)
    rings = 2 * len(axes)
    return [_phase(f"torus:{shape}", np.tile(flat, rings), dst, ring_allreduce_factor(g) / rings,
                   2 * sum(layout.shape[ax] - 1 for ax in axes))]


def _hierarchical_phases(g: int, h: int) -> list[Phase]:
    if h < 2 or g % h or g // h < 2:
        raise ConfigError(f"hierarchical:{h} needs blocks of {h} that divide the group of "
                          f"{g} into at least two")
    blocks = g // h
    members = np.arange(g).reshape(blocks, h)
    intra = _ring(f"hier-intra:h={h}", members, (h - 1) / h / 2, h - 1)
    inter = _ring(f"hier-inter:h={h}", members.T, (blocks - 1) / blocks / h, 2 * (blocks - 1))
    return [intra, inter, intra]


def _rails_phases(g: int, h: int) -> list[Phase]:
    if h < 2 or g % h:
        raise ConfigError(f"rails:{h} needs blocks of {h} that divide the group of {g}")
    if g == h:
        return _ring_phases(g)
    members = np.arange(g).reshape(g // h, h)
    intra = _ring("", members, (g - 1) / g, 2 * (g - 1))
    inter = _ring("", members.T, (g - 1) / g, 2 * (g - 1))
    weight = np.concatenate([np.full(len(intra.src), (h - 1) / h),
                             np.full(len(inter.src), 1 / h)])
    return [_phase(f"rails:h={h}", np.concatenate([intra.src, inter.src]),
                   np.concatenate([intra.dst, inter.dst]), (g - 1) / g, 2 * (g - 1), weight)]


ALLREDUCE = ("ring", "tree", "halving-doubling", "doubling", "torus", "hierarchical", "rails")


def _block_size(name: str, arg: str, g: int) -> int:
    """The H of ``name:H``, or the largest of 2, 4, 8 that splits the group."""
    try:
        h = int(arg) if arg else (hierarchy_sizes(g) or [0])[-1]
    except ValueError:
        raise ConfigError(f"bad {name} block size {arg!r}") from None
    if not h:
        raise ConfigError(f"{name}: no block size of 2, 4 or 8 splits a group of {g}")
    return h


def allreduce_phases(name: str, g: int, layout: np.ndarray | None = None) -> list[Phase]:
    """The phases of host-based all-reduce ``name`` (``hierarchical:H`` for blocks of H);
    ``layout``: the members as a grid (their places on a torus or mesh) for ``torus``."""
    if g < 2:
        return []
    base, _, arg = name.partition(":")
    if base == "ring":
        return _ring_phases(g)
    if base == "tree":
        return _tree_phases(g)
    if base == "halving-doubling":
        return _xor_rounds(g, base, halving=True)
    if base == "doubling":
        return _xor_rounds(g, base, halving=False)
    if base == "torus":
        return _torus_phases(g, layout)
    if base in ("hierarchical", "rails"):
        h = _block_size(base, arg, g)
        return _hierarchical_phases(g, h) if base == "hierarchical" else _rails_phases(g, h)
    raise ConfigError(f"unknown all-reduce algorithm {name!r} (known: {', '.join(ALLREDUCE)})")


def ina_phases(g: int, up: float = 1.0, down: float = 1.0) -> list[Phase]:
    """In-network aggregation: up and down streams of ``up`` x n and ``down`` x n bytes."""
    if g < 2:
        return []
    i = np.arange(g)
    sw = np.full(g, SWITCH)
    weight = np.concatenate([np.full(g, up), np.full(g, down)])
    return [_phase(f"ina:up={up:.6g},down={down:.6g}", np.concatenate([i, sw]),
                   np.concatenate([sw, i]), 1.0, 1, weight)]


def allgather_phases(g: int) -> list[Phase]:
    """Bidirectional ring all-gather of n bytes per member."""
    if g < 2:
        return []
    return [_ring("allgather", np.arange(g), (g - 1) / 2, g - 1)]


def alltoall_phases(g: int, groups: int = 1, max_flows: int = 500_000,
                    seed: int = 0) -> list[Phase]:
    """Pairwise all-to-all of n bytes per member (n/g to each), sampled above
    ``max_flows`` flows over all ``groups`` groups (module docstring)."""
    if g < 2:
        return []
    members = np.arange(g)
    if groups * g * (g - 1) <= max_flows:
        i, j = np.nonzero(~np.eye(g, dtype=bool))
        return [_phase("alltoall", i, j, 1 / g, g - 1)]
    k = max(1, max_flows // (groups * g))
    offsets = np.sort(np.random.default_rng(seed).choice(np.arange(1, g), k, replace=False))
    src = np.tile(members, k)
    dst = ((members[None, :] + offsets[:, None]) % g).ravel()
    return [_phase(f"alltoall:sampled={k}", src, dst, 1 / g, g - 1,
                   np.full(len(src), (g - 1) / k))]
