"""HammingMesh Hx{a}Mesh (Hoefler et al., SC'22; docs/references.md), and 2D HyperX.

Boards of a x b accelerators wired as a 2D mesh in board traces; boards in an x x y grid.
Every global row of accelerators (board row Y, local row j) is joined by a non-blocking
fat tree over the x boards: the west port of local column 0 and the east port of local
column a-1 of each board (2x endpoint ports per row). Every global column likewise,
through the north and south edges (2y endpoints). P ports per accelerator, P/4 per
direction ("lanes").

Only board-edge ports need switch ports and (optical, long) cables: 2(a+b) of the 4ab
ports of a board, the fraction (a+b)/(2ab) (1 for a=b=1, which is the 2D HyperX with each
dimension a fat tree; 1/2 for Hx2Mesh; 1/4 for Hx4Mesh). Accelerators forward traffic
(mesh hops, and between a row and a column network).

Closed forms (lanes l, link rate r):

- bisection: cutting the board grid across x cuts every row tree in half,
  y b 2 floor(x/2) l r; across y: x a 2 floor(y/2) l r; the bisection is the smaller;
  so x y min(a,b) l r for even x and y. All-to-all per accelerator is then bounded by
  4 B / N = P r / max(a,b): about injection / a;
- all-reduce: the (x a) x (y b) accelerators form a logical 2D torus whose row rings run
  through the mesh and hop between boards through the row tree; both directions of both
  dimensions busy: 2(xa + yb - 2) a + 2(N-1)/N n / (P r) (near full injection). For
  a = b = 1, Rabenseifner inside each row and column tree instead has 2 log2(x y) latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan import collectives as coll
from dlcomm.plan.topology.base import (
    AllreduceChoice,
    Counts,
    SwitchGroup,
    Topology,
    add_link,
    merge_groups,
    param_suffix,
    take_options,
)
from dlcomm.plan.topology.clos import Clos
from dlcomm.volume import ring_allreduce_factor

__all__ = ["HxMesh"]


@dataclass(frozen=True)
class HxMesh(Topology):
    kind = "hxmesh"
    a: int      # board width (accelerators)
    b: int      # board height
    x: int      # boards per grid row
    y: int      # boards per grid column

    def __post_init__(self) -> None:
        if min(self.a, self.b) < 1 or min(self.x, self.y) < 2:
            raise ConfigError(f"HammingMesh needs a, b >= 1 and x, y >= 2, got a={self.a} "
                              f"b={self.b} x={self.x} y={self.y}")
        if self.params.ports % 4:
            raise ConfigError(f"HammingMesh needs ports per accelerator in multiples of 4, "
                              f"got {self.params.ports}")
        self.row_tree, self.col_tree  # noqa: B018  (rows and columns must be buildable)

    @property
    def lanes(self) -> int:
        return self.params.ports // 4

    @property
    def accelerators(self) -> int:
        return self.a * self.b * self.x * self.y

    @property
    def name(self) -> str:
        grid = f"{self.x}x{self.y}"
        if self.a == self.b == 1:
            return f"2D HyperX {grid}"
        board = f"{self.a}" if self.a == self.b else f"{self.a}x{self.b}"
        return f"Hx{board}Mesh {grid}"

    @property
    def spec(self) -> str:
        if self.a == self.b == 1:
            return f"hyperx2d:x={self.x},y={self.y}" + param_suffix(self.params)
        return (f"hxmesh:a={self.a},b={self.b},x={self.x},y={self.y}"
                + param_suffix(self.params))

    @cached_property
    def row_tree(self) -> Clos:
        return Clos(2 * self.x * self.lanes, self.params.radix, self.lanes)

    @cached_property
    def col_tree(self) -> Clos:
        return Clos(2 * self.y * self.lanes, self.params.radix, self.lanes)

    def acc(self, bx: int, by: int, i: int, j: int) -> int:
        """Accelerator id: boards in row-major grid order, row-major inside a board."""
        return ((by * self.x + bx) * self.b + j) * self.a + i

    def counts(self) -> Counts:
        n, lanes, boards = self.accelerators, self.lanes, self.x * self.y
        edge = boards * 2 * (self.a + self.b) * lanes
        trace = boards * (2 * self.a * self.b - self.a - self.b) * lanes
        groups: list[SwitchGroup] = []
        for tree, copies, dim in ((self.row_tree, self.y * self.b, "row"),
                                  (self.col_tree, self.x * self.a, "column")):
            groups += [SwitchGroup(f"{dim} {g.role}", g.level, g.radix, g.count * copies,
                                   g.ports_used * copies) for g in tree.switch_groups()]
        inter = (self.y * self.b * self.row_tree.inter_switch_links
                 + self.x * self.a * self.col_tree.inter_switch_links)
        return Counts(n, n * self.params.ports, edge, edge, edge, trace, merge_groups(groups),
                      {"dac": 0, "aoc": edge + inter})

    def _edge_devices(self) -> tuple[dict, dict]:
        rows: dict[tuple[int, int], list[tuple[int, int]]] = {}
        cols: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for by in range(self.y):
            for j in range(self.b):
                rows[(by, j)] = [(self.acc(bx, by, i, j), self.lanes)
                                 for bx in range(self.x) for i in (0, self.a - 1)]
        for bx in range(self.x):
            for i in range(self.a):
                cols[(bx, i)] = [(self.acc(bx, by, i, j), self.lanes)
                                 for by in range(self.y) for j in (0, self.b - 1)]
        return rows, cols

    def graph(self, detail: str = "logical") -> Any:
        import networkx as nx

        if detail not in ("logical", "switches"):
            raise ConfigError(f"unknown graph detail {detail!r} (logical, switches)")
        r, lanes = self.params.rate_gbps, self.lanes
        g = nx.Graph(name=self.name)
        for by in range(self.y):
            for bx in range(self.x):
                for j in range(self.b):
                    for i in range(self.a):
                        g.add_node(self.acc(bx, by, i, j), kind="acc", pos=(0, bx, by, i, j))
        for by in range(self.y):
            for bx in range(self.x):
                for j in range(self.b):
                    for i in range(self.a):
                        here = self.acc(bx, by, i, j)
                        if i + 1 < self.a:
                            add_link(g, here, self.acc(bx, by, i + 1, j), lanes * r, "trace",
                                     lanes)
                        if j + 1 < self.b:
                            add_link(g, here, self.acc(bx, by, i, j + 1), lanes * r, "trace",
                                     lanes)
        rows, cols = self._edge_devices()
        if detail == "switches":
            for key, devices in rows.items():
                self.row_tree.build(g, devices, r, ("row", *key), "aoc")
            for key, devices in cols.items():
                self.col_tree.build(g, devices, r, ("col", *key), "aoc")
            return g
        g.graph["translations"] = (0, self.x, self.y, 0, 0)
        for (by, j), devices in rows.items():
            node = ("row", by, j)
            g.add_node(node, kind="switch" if self.row_tree.levels == 1 else "xbar",
                       pos=(1, -1, by, -1, j))
            for acc, ports in devices:
                add_link(g, acc, node, ports * r, "aoc", ports)
        for (bx, i), devices in cols.items():
            node = ("col", bx, i)
            g.add_node(node, kind="switch" if self.col_tree.levels == 1 else "xbar",
                       pos=(2, bx, -1, i, -1))
            for acc, ports in devices:
                add_link(g, acc, node, ports * r, "aoc", ports)
        return g

    def _cuts(self) -> tuple[float, float]:
        cap = self.lanes * self.params.rate_gbps
        across_x = self.y * self.b * 2 * (self.x // 2) * cap
        across_y = self.x * self.a * 2 * (self.y // 2) * cap
        return across_x, across_y

    def bisection_gbps(self) -> float:
        return min(self._cuts())

    def bisection_halves(self) -> tuple[list[int], list[int]]:
        across_x, across_y = self._cuts()
        low, high = [], []
        for by in range(self.y):
            for bx in range(self.x):
                side = bx < self.x // 2 if across_x <= across_y else by < self.y // 2
                for j in range(self.b):
                    for i in range(self.a):
                        (low if side else high).append(self.acc(bx, by, i, j))
        return low, high

    def allreduce_candidates(self, nbytes: float, alpha: float) -> list[AllreduceChoice]:
        link = self._bytes_per_s(self.params.rate_gbps)
        n, p = self.accelerators, self.params.ports
        dims = [self.x * self.a, self.y * self.b]
        out = [AllreduceChoice("torus-rings", coll.torus_allreduce(dims, nbytes, alpha,
                                                                   1 / link, rings=p)),
               AllreduceChoice("ring", coll.ring_allreduce(n, nbytes, alpha,
                                                           1 / (self.lanes * link)))]
        if self.a == self.b == 1:
            steps = coll.log2_steps(self.x) + coll.log2_steps(self.y)
            out.append(AllreduceChoice("row-column rabenseifner", 2 * steps * alpha
                                       + ring_allreduce_factor(n) * nbytes / (p * link)))
        return out


def make_hxmesh(options: dict[str, Any], params: Any) -> HxMesh:
    """HammingMesh: a x b boards (2D mesh) in an x x y grid, rows/columns on fat trees"""
    opts, params = take_options("hxmesh", options, {k: int for k in "abxy"}, params)
    missing = [k for k in "xy" if k not in opts]
    if missing:
        raise ConfigError("hxmesh needs x=BOARDS,y=BOARDS (and a=,b=, default 2)")
    a = opts.get("a", 2)
    return HxMesh(a, opts.get("b", a), opts["x"], opts["y"], params=params)


def make_hyperx(options: dict[str, Any], params: Any) -> HxMesh:
    """2D HyperX: x x y accelerators, every row and column a fat tree (Hx1Mesh)"""
    opts, params = take_options("hyperx2d", options, {"x": int, "y": int}, params)
    if "x" not in opts or "y" not in opts:
        raise ConfigError("hyperx2d needs x=N,y=N")
    return HxMesh(1, 1, opts["x"], opts["y"], params=params)
