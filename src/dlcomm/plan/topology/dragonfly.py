"""Dragonfly (Kim et al., ISCA'08): groups of routers, all-to-all inside and between groups.

A group has ``a`` routers, each with ``p`` terminal ports, a-1 local links (one to every
router of its group) and ``h`` global links. Balanced by default from the radix k:
p = h = floor(k/4), a = 2p (p + a - 1 + h = k - 1 ports). An accelerator puts its P ports
on one router, so a router hosts floor(p/P) accelerators; g groups (g <= a h + 1).

Global wiring is circulant and interleaved: each group's a h global ports are numbered
(router = port // h); for every offset d = 1..g-1, L = floor(a h / (g-1)) links connect
group i to group i+d (mod g): link m joins port m (g-1) + d-1 of group i to port
m (g-1) + g-d-1 of group i+d. Consecutive ports go to different groups, so every router
reaches as many groups directly as it has global ports. Rotating all groups by one is an
automorphism, which the flow model exploits.

Cables: accelerator-router and local links ``dac`` (a group sits in neighbouring racks,
electrical as in Cray Cascade), global links ``aoc``.

Closed forms (link rate r):

- bisection: half of the groups against the other half: floor(g/2) ceil(g/2) L r;
  one group: floor(a/2) ceil(a/2) r;
- all-reduce: a group-ordered ring (P rings in parallel, each crossing between groups on
  its own global link); or hierarchical: ring reduce-scatter inside the group (q = a
  floor(p/P) accelerators), q concurrent rings across the groups on n/q, strided over all
  offsets so that they share the (g-1) L global links of a group: per accelerator
  min(P r, (g-1) L r / q); then the all-gather inside the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan import collectives as coll
from dlcomm.plan.topology.base import (
    AllreduceChoice,
    Counts,
    SwitchGroup,
    Topology,
    add_link,
    param_suffix,
    take_options,
)

__all__ = ["Dragonfly"]


@dataclass(frozen=True)
class Dragonfly(Topology):
    kind = "dragonfly"
    g: int                # groups
    a: int = 0            # routers per group (0: 2 floor(radix/4))
    p: int = 0            # terminal ports per router (0: floor(radix/4))
    h: int = 0            # global ports per router (0: floor(radix/4))

    def __post_init__(self) -> None:
        q = self.params.radix // 4
        for key, default in (("a", 2 * q), ("p", q), ("h", q)):
            if getattr(self, key) == 0:
                object.__setattr__(self, key, default)
        if self.g < 1 or self.a < 2 or self.h < 1:
            raise ConfigError(f"dragonfly needs g >= 1, a >= 2, h >= 1 (g={self.g}, "
                              f"a={self.a}, h={self.h})")
        if self.p < self.params.ports:
            raise ConfigError(f"dragonfly routers need p >= ports per accelerator "
                              f"({self.p} < {self.params.ports})")
        if self.p + self.a - 1 + self.h > self.params.radix:
            raise ConfigError(f"p + a - 1 + h = {self.p + self.a - 1 + self.h} exceeds the "
                              f"radix {self.params.radix}")
        if self.g > self.a * self.h + 1:
            raise ConfigError(f"a dragonfly with a={self.a}, h={self.h} has at most "
                              f"{self.a * self.h + 1} groups, got g={self.g}")

    @property
    def per_router(self) -> int:
        return self.p // self.params.ports

    @property
    def accelerators(self) -> int:
        return self.g * self.a * self.per_router

    @property
    def links_per_pair(self) -> int:
        return self.a * self.h // (self.g - 1) if self.g > 1 else 0

    @property
    def name(self) -> str:
        return f"dragonfly g={self.g} a={self.a}"

    @property
    def spec(self) -> str:
        return (f"dragonfly:g={self.g},a={self.a},p={self.p},h={self.h}"
                + param_suffix(self.params))

    def router(self, group: int, r: int) -> tuple[str, int, int]:
        return ("router", group % self.g, r)

    def global_links(self) -> list[tuple[tuple[str, int, int], tuple[str, int, int]]]:
        """Every global link once, as (router, router)."""
        g, h, links = self.g, self.h, self.links_per_pair
        out = []
        for i in range(g):
            for d in range(1, g):
                if d > g - d or (d == g - d and i >= g // 2):
                    continue
                for m in range(links):
                    here, there = m * (g - 1) + d - 1, m * (g - 1) + g - d - 1
                    out.append((self.router(i, here // h), self.router(i + d, there // h)))
        return out

    def counts(self) -> Counts:
        n, ports = self.accelerators, self.params.ports
        local = self.g * self.a * (self.a - 1) // 2
        glob = self.g * (self.g - 1) * self.links_per_pair // 2
        used = n * ports + 2 * (local + glob)
        return Counts(n, n * ports, n * ports, n * ports, 0, 0,
                      (SwitchGroup("router", 1, self.params.radix, self.g * self.a, used),),
                      {"dac": n * ports + local, "aoc": glob})

    def graph(self, detail: str = "logical") -> Any:
        import networkx as nx

        if detail not in ("logical", "switches"):
            raise ConfigError(f"unknown graph detail {detail!r} (logical, switches)")
        r, ports, apr = self.params.rate_gbps, self.params.ports, self.per_router
        g = nx.Graph(name=self.name, translations=(0, self.g, 0, apr))
        for grp in range(self.g):
            for k in range(self.a):
                g.add_node(self.router(grp, k), kind="switch", level=1, role="router",
                           pos=(1, grp, k, -1))
                for t in range(apr):
                    acc = (grp * self.a + k) * apr + t
                    g.add_node(acc, kind="acc", pos=(0, grp, k, t))
                    add_link(g, acc, self.router(grp, k), ports * r, "dac", ports)
            for k in range(self.a):
                for k2 in range(k + 1, self.a):
                    add_link(g, self.router(grp, k), self.router(grp, k2), r, "dac")
        for u, v in self.global_links():
            add_link(g, u, v, r, "aoc")
        return g

    def bisection_gbps(self) -> float:
        r = self.params.rate_gbps
        if self.g == 1:
            return (self.a // 2) * (self.a - self.a // 2) * r
        return (self.g // 2) * (self.g - self.g // 2) * self.links_per_pair * r

    def bisection_halves(self) -> tuple[list[int], list[int]]:
        n = self.accelerators
        if self.g == 1:
            cut = (self.a // 2) * self.per_router
        else:
            cut = (self.g // 2) * self.a * self.per_router
        return list(range(cut)), list(range(cut, n))

    def allreduce_candidates(self, nbytes: float, alpha: float) -> list[AllreduceChoice]:
        n, ports = self.accelerators, self.params.ports
        link = self._bytes_per_s(self.params.rate_gbps)
        inj = ports * link
        ring_rate = inj if self.g == 1 else min(inj, self.links_per_pair * link)
        out = [AllreduceChoice("ring", coll.ring_allreduce(n, nbytes, alpha, 1 / ring_rate))]
        q = self.a * self.per_router
        if self.g > 1 and q > 1:
            inter = min(inj, (self.g - 1) * self.links_per_pair * link / q)
            out.append(AllreduceChoice("hierarchical", coll.hierarchical_allreduce(
                q, self.g, nbytes, alpha, 1 / inj, 1 / inter)))
        return out


def make_dragonfly(options: dict[str, Any], params: Any) -> Dragonfly:
    """Dragonfly: g groups of a routers (balanced from the radix by default)"""
    opts, params = take_options("dragonfly", options, {k: int for k in "gaph"}, params)
    if "g" not in opts:
        raise ConfigError("dragonfly needs g=GROUPS (and optionally a=, p=, h=)")
    return Dragonfly(opts["g"], opts.get("a", 0), opts.get("p", 0), opts.get("h", 0),
                     params=params)
