"""Communication graphs of decentralized training: which worker sends its model to which.

A :class:`Graph` is a set of directed edges ``(src, dst)`` over ranks ``0..n-1``: ``src``
sends its model to ``dst`` every iteration, so ``src`` is an *in-neighbour* of ``dst``.
Two workers are *neighbours* if an edge joins them in either direction; Hop bounds the
iteration gap of every neighbour pair.

Graphs by name (the ``graph=`` option of ``hop`` and ``adpsgd``):

- ``ring``: i <-> i+1 (mod n);
- ``torus``: a 2-D torus of ``rows`` x n/rows (default: the most square factorisation),
  i <-> its four grid neighbours with wrap-around;
- ``exp``: the directed exponential graph, i -> i + 2^k (mod n) for 2^k < n (log2 n
  out-neighbours; used by Stochastic Gradient Push and Hop's evaluation);
- ``complete``: every pair;
- ``bipartite``: every even rank <-> every odd rank (a complete bipartite graph);
- ``edges``: a custom list, ``edges=0-1+1-2+2>0`` (``a-b`` both ways, ``a>b`` one way).

Every graph must be strongly connected, or some workers would never learn from others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dlcomm.errors import ConfigError
from dlcomm.registry import Registry

__all__ = ["Graph", "GRAPHS", "make_graph", "parse_edges"]


@dataclass(frozen=True)
class Graph:
    """Directed edges over ranks ``0..n-1`` (no self-loops)."""

    name: str
    n: int
    edges: frozenset[tuple[int, int]]

    def __post_init__(self) -> None:
        for a, b in self.edges:
            if not (0 <= a < self.n and 0 <= b < self.n):
                raise ConfigError(f"graph {self.name}: edge {a}->{b} outside ranks 0..{self.n - 1}")
            if a == b:
                raise ConfigError(f"graph {self.name}: self-loop at rank {a}")

    def in_neighbours(self, i: int) -> tuple[int, ...]:
        """Ranks whose models ``i`` receives."""
        return tuple(sorted(a for a, b in self.edges if b == i))

    def out_neighbours(self, i: int) -> tuple[int, ...]:
        """Ranks that receive ``i``'s model."""
        return tuple(sorted(b for a, b in self.edges if a == i))

    def neighbours(self, i: int) -> tuple[int, ...]:
        """Ranks joined to ``i`` in either direction (Hop's token pairs)."""
        return tuple(sorted(set(self.in_neighbours(i)) | set(self.out_neighbours(i))))

    def undirected_pairs(self) -> list[tuple[int, int]]:
        return sorted({(min(a, b), max(a, b)) for a, b in self.edges})

    def strongly_connected(self) -> bool:
        if self.n == 1:
            return True
        for forward in (True, False):
            seen, todo = {0}, [0]
            while todo:
                i = todo.pop()
                for j in (self.out_neighbours(i) if forward else self.in_neighbours(i)):
                    if j not in seen:
                        seen.add(j)
                        todo.append(j)
            if len(seen) != self.n:
                return False
        return True

    def two_colouring(self) -> list[int] | None:
        """Colour 0/1 per rank with every edge between colours (rank 0 gets 0), or None."""
        colour = [-1] * self.n  # -1: not coloured yet
        for start in range(self.n):
            if colour[start] >= 0:
                continue
            colour[start] = 0
            todo = [start]
            while todo:
                i = todo.pop()
                for j in self.neighbours(i):
                    if colour[j] < 0:
                        colour[j] = 1 - colour[i]
                        todo.append(j)
                    elif colour[j] == colour[i]:
                        return None
        return colour


GRAPHS: Registry[Graph] = Registry("graph")


def _both(pairs: list[tuple[int, int]]) -> frozenset[tuple[int, int]]:
    return frozenset({(a, b) for a, b in pairs if a != b} | {(b, a) for a, b in pairs if a != b})


@GRAPHS.register("ring", "i <-> i+1 (mod n)")
def ring(n: int, **_: str) -> Graph:
    return Graph("ring", n, _both([(i, (i + 1) % n) for i in range(n)]))


@GRAPHS.register("torus", "2-D torus rows x n/rows with wrap-around")
def torus(n: int, rows: str | None = None, **_: str) -> Graph:
    if rows is None:
        r = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    else:
        try:
            r = int(rows)
        except ValueError:
            raise ConfigError(f"graph torus: rows must be an integer, got {rows!r}") from None
        if r < 1 or n % r:
            raise ConfigError(f"graph torus: rows={r} must divide the {n} workers")
    c = n // r
    pairs = []
    for i in range(n):
        y, x = divmod(i, c)
        pairs += [(i, y * c + (x + 1) % c), (i, ((y + 1) % r) * c + x)]
    return Graph(f"torus{r}x{c}", n, _both(pairs))


@GRAPHS.register("exp", "directed exponential graph: i -> i + 2^k (mod n)")
def exponential(n: int, **_: str) -> Graph:
    edges = set()
    step = 1
    while step < n:
        edges |= {(i, (i + step) % n) for i in range(n)}
        step *= 2
    return Graph("exp", n, frozenset(e for e in edges if e[0] != e[1]))


@GRAPHS.register("complete", "every pair of workers")
def complete(n: int, **_: str) -> Graph:
    return Graph("complete", n, _both([(a, b) for a in range(n) for b in range(a + 1, n)]))


@GRAPHS.register("bipartite", "every even rank <-> every odd rank")
def bipartite(n: int, **_: str) -> Graph:
    return Graph("bipartite", n, _both([(a, b) for a in range(0, n, 2) for b in range(1, n, 2)]))


def parse_edges(text: str, n: int) -> frozenset[tuple[int, int]]:
    """``0-1+1-2+2>0``: ``a-b`` joins a and b both ways, ``a>b`` sends a's model to b."""
    edges: set[tuple[int, int]] = set()
    for item in filter(None, (p.strip() for p in text.replace(";", "+").split("+"))):
        sep = ">" if ">" in item else "-"
        a, _, b = item.partition(sep)
        try:
            i, j = int(a), int(b)
        except ValueError:
            raise ConfigError(f"bad edge {item!r} (expected A-B or A>B with ranks)") from None
        if not (0 <= i < n and 0 <= j < n) or i == j:
            raise ConfigError(f"bad edge {item!r}: ranks must differ and lie in 0..{n - 1}")
        edges.add((i, j))
        if sep == "-":
            edges.add((j, i))
    if not edges:
        raise ConfigError("graph edges: the edge list is empty (edges=0-1+1-2+...)")
    return frozenset(edges)


@GRAPHS.register("edges", "custom edge list: edges=0-1+1-2+2>0")
def custom(n: int, edges: str | None = None, **_: str) -> Graph:
    if not edges:
        raise ConfigError("graph=edges needs edges=A-B+C>D... (a-b both ways, a>b one way)")
    return Graph("edges", n, parse_edges(edges, n))


def make_graph(name: str, n: int, **options: str) -> Graph:
    """Build graph ``name`` over ``n`` workers and check it is strongly connected."""
    if n < 2:
        raise ConfigError(f"decentralized training needs >= 2 workers, got {n}")
    factory: Callable[..., Graph] = GRAPHS.get(name)
    graph = factory(n, **options)
    if not graph.strongly_connected():
        raise ConfigError(f"graph {graph.name} over {n} workers is not strongly connected")
    return graph
