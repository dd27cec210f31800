"""k-ary tori (2D, 3D, any dimension): accelerators cabled directly to their neighbours.

Each accelerator splits its P ports evenly over the 2d directions (P must be a multiple
of 2d), so a neighbour link carries P/(2d) ports' worth. Routing is dimension-order
(edge ``order`` = dimension: shortest paths, x first, split evenly only where both
directions of a dimension are equally short).

Packaging: racks hold blocks of up to 4 accelerators per dimension (4 x 4 for 2D, 4 x 4
x 4 for 3D, as TPU v4 racks hold 4 x 4 x 4 chips: Jouppi et al., ISCA'23); links inside a
block are ``dac``, links that leave it (wrap-around included) ``aoc``. No switches.

Closed forms (dims k1..kd, N accelerators, neighbour link capacity c = P/(2d) r):

- bisection: cut the largest dimension k in half: 2 N / k links, 2 N c / k (k even);
- all-reduce: rings dimension by dimension, both directions of every dimension busy
  (P directed links per accelerator): 2(k1+..+kd - d) a + 2(N-1)/N n / (P r);
  or one Hamiltonian ring on a single neighbour link: 2(N-1) a + 2(N-1)/N n / c.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan import collectives as coll
from dlcomm.plan.topology.base import (
    AllreduceChoice,
    Counts,
    Topology,
    add_link,
    param_suffix,
    take_options,
)

__all__ = ["Torus", "RACK_BLOCK"]

RACK_BLOCK = 4   # accelerators per dimension in one rack


@dataclass(frozen=True)
class Torus(Topology):
    kind = "torus"
    dims: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.dims) < 1 or any(k < 2 for k in self.dims):
            raise ConfigError(f"torus dimensions must be >= 2, got {self.dims}")
        if self.params.ports % (2 * len(self.dims)):
            raise ConfigError(f"a {len(self.dims)}D torus needs ports per accelerator in "
                              f"multiples of {2 * len(self.dims)}, got {self.params.ports}")

    @property
    def accelerators(self) -> int:
        return math.prod(self.dims)

    @property
    def lanes(self) -> int:
        return self.params.ports // (2 * len(self.dims))

    @property
    def name(self) -> str:
        return f"{len(self.dims)}D torus " + "x".join(map(str, self.dims))

    @property
    def spec(self) -> str:
        keys = "xyzwv"[:len(self.dims)] if len(self.dims) <= 5 else None
        if keys is None:
            raise ConfigError("tori above 5 dimensions have no spec")
        opts = ",".join(f"{k}={v}" for k, v in zip(keys, self.dims))
        return f"torus{len(self.dims)}d:{opts}" + param_suffix(self.params)

    def coords(self) -> np.ndarray:
        """(N, d) coordinates in natural (row-major, first dimension fastest) order."""
        grids = np.meshgrid(*[np.arange(k) for k in reversed(self.dims)], indexing="ij")
        return np.stack([g.ravel() for g in reversed(grids)], axis=1)

    def index(self, coord: tuple[int, ...]) -> int:
        idx, stride = 0, 1
        for c, k in zip(coord, self.dims):
            idx += (c % k) * stride
            stride *= k
        return idx

    def counts(self) -> Counts:
        n, lanes = self.accelerators, self.lanes
        links = n * self.params.ports // 2
        block = [min(k, RACK_BLOCK) for k in self.dims]
        long = sum(n // b * lanes for k, b in zip(self.dims, block) if b < k)
        ports = n * self.params.ports
        return Counts(n, ports, 0, ports, 2 * long, 0, (),
                      {"dac": links - long, "aoc": long})

    def graph(self, detail: str = "logical") -> Any:
        import networkx as nx

        if detail not in ("logical", "switches"):
            raise ConfigError(f"unknown graph detail {detail!r} (logical, switches)")
        cap = self.lanes * self.params.rate_gbps
        g = nx.Graph(name=self.name, translations=(0, *self.dims))
        block = [min(k, RACK_BLOCK) for k in self.dims]
        for i, coord in enumerate(self.coords()):
            g.add_node(i, kind="acc", pos=(0, *map(int, coord)))
        for i, coord in enumerate(self.coords()):
            for dim, k in enumerate(self.dims):
                nxt = list(coord)
                nxt[dim] += 1
                crosses = nxt[dim] % block[dim] == 0 and block[dim] < k
                add_link(g, i, self.index(tuple(nxt)), cap, "aoc" if crosses else "dac",
                         self.lanes, order=dim)
        return g

    def bisection_gbps(self) -> float:
        # every ring of the largest dimension is cut twice (k = 2: its two parallel links)
        k = max(self.dims)
        return 2 * (self.accelerators // k) * self.lanes * self.params.rate_gbps

    def bisection_halves(self) -> tuple[list[int], list[int]]:
        dim = int(np.argmax(self.dims))
        low = self.coords()[:, dim] < self.dims[dim] // 2
        return np.flatnonzero(low).tolist(), np.flatnonzero(~low).tolist()

    def allreduce_candidates(self, nbytes: float, alpha: float) -> list[AllreduceChoice]:
        link = self._bytes_per_s(self.params.rate_gbps)
        return [
            AllreduceChoice("torus-rings", coll.torus_allreduce(
                self.dims, nbytes, alpha, 1 / link, rings=self.params.ports)),
            AllreduceChoice("ring", coll.ring_allreduce(
                self.accelerators, nbytes, alpha, 1 / (self.lanes * link))),
        ]

    def snake_ring(self) -> list[int]:
        """A Hamiltonian cycle over neighbour links (2D with an even first or second
        dimension): boustrophedon rows, closed through the first column."""
        if len(self.dims) != 2:
            raise ConfigError("snake_ring is defined for 2D tori")
        x, y = self.dims
        if y % 2:
            raise ConfigError("snake_ring needs an even second dimension")
        order = [(0, 0)]
        for row in range(y):
            cols = range(1, x) if row % 2 == 0 else range(x - 1, 0, -1)
            order += [(c, row) for c in cols]
        order += [(0, row) for row in range(y - 1, 0, -1)]
        return [self.index(c) for c in order]


def make_torus(ndim: int):
    keys = "xyzwv"[:ndim]

    def factory(options: dict[str, Any], params: Any) -> Torus:
        opts, params = take_options(f"torus{ndim}d", options, {k: int for k in keys}, params)
        missing = [k for k in keys if k not in opts]
        if missing:
            raise ConfigError(f"torus{ndim}d needs " + ",".join(f"{k}=N" for k in keys))
        return Torus(tuple(opts[k] for k in keys), params=params)

    factory.__doc__ = f"{ndim}D torus ({'x'.join(keys)} accelerators), neighbour links only"
    return factory


def near_cube(n: int, ndim: int) -> tuple[int, ...]:
    """The factorization of n into ``ndim`` factors (each >= 2) closest to a cube;
    if there is none, the nearest cube-like shape."""
    best: tuple[int, ...] | None = None
    divisors = [d for d in range(2, n + 1) if n % d == 0]
    for combo in itertools.combinations_with_replacement(divisors, ndim - 1):
        rest = n // math.prod(combo) if n % math.prod(combo) == 0 else 0
        if rest < 2:
            continue
        shape = tuple(sorted((*combo, rest)))
        if best is None or shape[-1] / shape[0] < best[-1] / best[0]:
            best = shape
    if best is not None and best[-1] / best[0] <= 4:
        return best
    side = max(2, round(n ** (1 / ndim)))
    shape = [side] * ndim
    shape[-1] = max(2, round(n / side ** (ndim - 1)))
    return tuple(shape)
