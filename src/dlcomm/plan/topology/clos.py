"""Folded-Clos (fat tree) sizing and wiring, shared by the fat trees and HammingMesh rows.

A Clos of ``endpoints`` ports on switches of radix k, with endpoint devices of ``group``
ports each (a device's ports share one leaf) and a leaf up/down ratio ``up_ratio``
(1 = non-blocking; tapering happens at the leaves only, the levels above are
non-blocking):

1. E <= k: one switch (level 1), nothing tapered.
2. Otherwise a leaf has d down ports (the largest multiple of ``group`` with
   d (1 + up_ratio) <= k) and u = ceil(up_ratio d) up ports; L1 = ceil(E / d) leaves.
3. Two levels when L1 <= k: S spines, S the smallest divisor of u with L1 u / S <= k, each
   leaf with u / S parallel links to every spine.
4. Three levels when L1 <= k/2 * k: pods of k/2 leaves; each pod has u aggregation
   switches, one link from every leaf of the pod to each (down = up = leaves in the pod);
   plane j (the j-th aggregation switch of every pod) has ceil(L1 / k) core switches,
   the up links of an aggregation switch spread round-robin over its plane's cores.
5. Larger: refused (a 3-level radix-64 tree holds 65,536 endpoint ports).

Cables: endpoint -> leaf is ``dac`` by default (top of rack), every switch-switch link
``aoc``. Switch ports used = E + 2 x (switch-switch links).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan.topology.base import SwitchGroup, add_link

__all__ = ["Clos"]


@dataclass(frozen=True)
class Clos:
    endpoints: int            # endpoint ports
    radix: int
    group: int = 1            # ports of one endpoint device (kept on one leaf)
    up_ratio: float = 1.0     # leaf up / down capacity; 1 = non-blocking

    def __post_init__(self) -> None:
        if self.endpoints < 1 or self.group < 1 or self.endpoints % self.group:
            raise ConfigError(f"a fat tree needs whole devices: {self.endpoints} ports "
                              f"in groups of {self.group}")
        if not 0 < self.up_ratio <= 1:
            raise ConfigError(f"leaf up/down ratio must be in (0, 1], got {self.up_ratio}")
        if self.levels > 1 and self.leaf_down < self.group:
            raise ConfigError(f"radix {self.radix} is too small for devices of "
                              f"{self.group} ports")
        if self.levels > 3:
            raise ConfigError(
                f"{self.endpoints} endpoint ports need more than 3 levels of radix "
                f"{self.radix} switches (at most {self.max_endpoints()} at this taper)")

    # -- sizing --------------------------------------------------------------------------
    @property
    def leaf_down(self) -> int:
        if self.endpoints <= self.radix:
            return self.endpoints
        d = math.floor(self.radix / (1 + self.up_ratio) + 1e-9)
        return self.group * (d // self.group)

    @property
    def leaf_up(self) -> int:
        if self.endpoints <= self.radix:
            return 0
        return max(1, math.ceil(self.up_ratio * self.leaf_down - 1e-9))

    @property
    def leaves(self) -> int:
        return 1 if self.endpoints <= self.radix else math.ceil(self.endpoints / self.leaf_down)

    @property
    def levels(self) -> int:
        if self.endpoints <= self.radix:
            return 1
        if self.leaf_down < 1:
            return 99
        if self.leaves <= self.radix:
            return 2
        if self.leaves <= self.radix // 2 * self.radix:
            return 3
        return 99

    def max_endpoints(self) -> int:
        d = self.group * (math.floor(self.radix / (1 + self.up_ratio) + 1e-9) // self.group)
        return d * (self.radix // 2) * self.radix

    @property
    def spines(self) -> int:
        """Two levels: number of spine switches."""
        u, need = self.leaf_up, self.leaves * self.leaf_up / self.radix
        return min(s for s in range(1, u + 1) if u % s == 0 and s >= need)

    @property
    def pods(self) -> int:
        return math.ceil(self.leaves / (self.radix // 2))

    @property
    def cores_per_plane(self) -> int:
        return math.ceil(self.leaves / self.radix)

    @property
    def inter_switch_links(self) -> int:
        return (self.levels - 1) * self.leaves * self.leaf_up

    @property
    def ports_used(self) -> int:
        return self.endpoints + 2 * self.inter_switch_links

    def switch_groups(self) -> list[SwitchGroup]:
        k, e, lu = self.radix, self.endpoints, self.leaves * self.leaf_up
        if self.levels == 1:
            return [SwitchGroup("leaf", 1, k, 1, e)]
        groups = [SwitchGroup("leaf", 1, k, self.leaves, e + lu)]
        if self.levels == 2:
            groups.append(SwitchGroup("spine", 2, k, self.spines, lu))
        else:
            groups.append(SwitchGroup("aggregation", 2, k, self.pods * self.leaf_up, 2 * lu))
            groups.append(SwitchGroup("core", 3, k, self.leaf_up * self.cores_per_plane, lu))
        return groups

    def leaf_of_port(self, port: int) -> int:
        return port // self.leaf_down

    # -- wiring --------------------------------------------------------------------------
    def build(self, graph: Any, devices: Sequence[tuple[Hashable, int]], rate: float,
              prefix: tuple[Any, ...] = (), endpoint_cable: str = "dac") -> list[Hashable]:
        """Add the switches of this Clos to ``graph`` and attach ``devices`` (node, ports)
        in order, filling leaf after leaf. Returns the leaf nodes."""
        if sum(p for _, p in devices) != self.endpoints:
            raise ValueError("devices do not match the endpoint count")
        leaves = [prefix + ("leaf", i) for i in range(self.leaves)]
        for leaf in leaves:
            graph.add_node(leaf, kind="switch", level=1, role="leaf")
        port = 0
        for node, ports in devices:
            add_link(graph, node, leaves[self.leaf_of_port(port)], ports * rate,
                     endpoint_cable, ports)
            port += ports
        if self.levels == 2:
            mult = self.leaf_up // self.spines
            for s in range(self.spines):
                spine = prefix + ("spine", s)
                graph.add_node(spine, kind="switch", level=2, role="spine")
                for leaf in leaves:
                    add_link(graph, leaf, spine, mult * rate, "aoc", mult)
        elif self.levels == 3:
            half, cores = self.radix // 2, self.cores_per_plane
            for q in range(self.pods):
                pod = leaves[q * half:(q + 1) * half]
                for j in range(self.leaf_up):
                    agg = prefix + ("agg", q, j)
                    graph.add_node(agg, kind="switch", level=2, role="aggregation")
                    for leaf in pod:
                        add_link(graph, leaf, agg, rate, "aoc")
                    for t in range(len(pod)):
                        core = prefix + ("core", j, t % cores)
                        graph.add_node(core, kind="switch", level=3, role="core")
                        add_link(graph, agg, core, rate, "aoc")
        return leaves
