"""Fat trees: non-blocking or tapered at the leaves, optionally with aggregating switches.

Sizing and wiring: ``dlcomm.plan.topology.clos`` (all ports of an accelerator on one
leaf). ``taper`` is the fraction of leaf up-link bandwidth removed: up/down = 1 - taper,
so ``taper=0.5`` is the "50% tapered" tree and ``taper=0.75`` keeps a quarter
(docs/references.md: HammingMesh). With two or more levels the accelerator count is
rounded up to whole leaves.

Closed forms (P ports of rate r, N accelerators, L1 leaves with u up links):

- bisection (first half of the leaves against the second): r min(N P / 2, floor(L1/2) u);
- all-reduce: a leaf-ordered ring crosses each leaf's up links once per direction
  (beta = 1 / min(P r, u r)); Rabenseifner with distance-doubling partners, where round
  s is limited by the leaf whose up links carry the most crossing partners; a binomial
  tree (reduce + broadcast, every round at the slowest round's beta); hierarchical
  (ring inside the leaf, then rings over the leaves on n/m); in-network aggregation
  (``ina=1``: T ~ n / (P r), SwitchML-style, one aggregated stream per up link).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan import collectives as coll
from dlcomm.plan.topology.base import AllreduceChoice, Counts, Topology, add_link, param_suffix
from dlcomm.plan.topology.clos import Clos

__all__ = ["FatTree"]


@dataclass(frozen=True)
class FatTree(Topology):
    kind = "fattree"
    n: int                  # requested accelerators (rounded up to whole leaves)
    taper: float = 0.0      # fraction of leaf up-link bandwidth removed
    ina: bool = False       # switches aggregate (in-network all-reduce)

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ConfigError(f"a fat tree needs >= 2 accelerators, got n={self.n}")
        if not 0 <= self.taper < 1:
            raise ConfigError(f"taper must be in [0, 1), got {self.taper}")
        self.clos  # noqa: B018  (size it now: a tree that cannot be built fails here)

    @cached_property
    def clos(self) -> Clos:
        p = self.params
        first = Clos(self.n * p.ports, p.radix, p.ports, 1 - self.taper)
        if first.levels == 1:
            return first
        per_leaf = first.leaf_down // p.ports
        return Clos(math.ceil(self.n / per_leaf) * per_leaf * p.ports, p.radix, p.ports,
                    1 - self.taper)

    @property
    def accelerators(self) -> int:
        return self.clos.endpoints // self.params.ports

    @property
    def per_leaf(self) -> int:
        return self.clos.leaf_down // self.params.ports

    @property
    def name(self) -> str:
        taper = "non-blocking" if self.taper == 0 else f"{self.taper:.0%} tapered"
        return f"fat tree {taper}" + (" + INA" if self.ina else "")

    @property
    def spec(self) -> str:
        return (f"fattree:n={self.accelerators},taper={self.taper:g}"
                + (",ina=1" if self.ina else "") + param_suffix(self.params))

    def counts(self) -> Counts:
        c, p = self.clos, self.params
        ports = self.accelerators * p.ports
        return Counts(self.accelerators, ports, ports, ports, 0, 0,
                      tuple(c.switch_groups()), {"dac": ports, "aoc": c.inter_switch_links})

    def graph(self, detail: str = "logical") -> Any:
        import networkx as nx

        c, p = self.clos, self.params
        r, n, m = p.rate_gbps, self.accelerators, self.per_leaf
        g = nx.Graph(name=self.name)
        if detail == "switches":
            for i in range(n):
                g.add_node(i, kind="acc")
            c.build(g, [(i, p.ports) for i in range(n)], r)
            return g
        if detail != "logical":
            raise ConfigError(f"unknown graph detail {detail!r} (logical, switches)")
        if c.levels == 1 or self.taper == 0:
            # one switch, or a non-blocking tree: under fluid ECMP both act as a crossbar
            g.graph["translations"] = (0, 1, n)
            g.add_node(("xbar",), kind="xbar" if c.levels > 1 else "switch", pos=(2, -1, -1))
            for i in range(n):
                g.add_node(i, kind="acc", pos=(0, 0, i))
                add_link(g, i, ("xbar",), p.ports * r, "dac", p.ports)
            return g
        g.graph["translations"] = (0, c.leaves, m)
        g.add_node(("xbar",), kind="xbar", pos=(2, -1, -1))
        for leaf in range(c.leaves):
            g.add_node(("leaf", leaf), kind="switch", level=1, role="leaf", pos=(1, leaf, -1))
            add_link(g, ("leaf", leaf), ("xbar",), c.leaf_up * r, "aoc", c.leaf_up)
        for i in range(n):
            g.add_node(i, kind="acc", pos=(0, i // m, i % m))
            add_link(g, i, ("leaf", i // m), p.ports * r, "dac", p.ports)
        return g

    def bisection_gbps(self) -> float:
        c, p = self.clos, self.params
        half = self.accelerators / 2 * p.ports
        if c.levels == 1:
            return half * p.rate_gbps
        return p.rate_gbps * min(half, (c.leaves // 2) * c.leaf_up)

    def bisection_halves(self) -> tuple[list[int], list[int]]:
        n = self.accelerators
        return list(range(n // 2)), list(range(n // 2, n))

    def allreduce_candidates(self, nbytes: float, alpha: float) -> list[AllreduceChoice]:
        c, p, n = self.clos, self.params, self.accelerators
        inj = self._bytes_per_s(p.injection_gbps)
        up = math.inf if c.levels == 1 else self._bytes_per_s(c.leaf_up * p.rate_gbps)
        m = n if c.levels == 1 else self.per_leaf
        out = [AllreduceChoice("ring", coll.ring_allreduce(n, nbytes, alpha, 1 / min(inj, up)))]
        if n & (n - 1) == 0:
            ranks = np.arange(n)
            betas = []
            for s in range(coll.log2_steps(n)):
                cross = (ranks ^ (1 << s)) // m != ranks // m
                worst = np.bincount(ranks // m, weights=cross).max()
                betas.append(1 / min(inj, up / worst) if worst else 1 / inj)
            out.append(AllreduceChoice("rabenseifner",
                                       coll.rabenseifner_steps(n, nbytes, alpha, betas)))
            # binomial reduce + broadcast: latency-optimal for small messages; every
            # round moves all n bytes, so its slowest round bounds it
            out.append(AllreduceChoice("binomial tree",
                                       coll.binomial_allreduce(n, nbytes, alpha, max(betas))))
        if c.levels > 1 and 1 < m < n:
            out.append(AllreduceChoice("hierarchical", coll.hierarchical_allreduce(
                m, n // m, nbytes, alpha, 1 / inj, 1 / min(inj, up / m))))
        if self.ina:
            out.append(AllreduceChoice("ina", coll.ina_allreduce(nbytes, alpha, 1 / inj,
                                                                 c.levels)))
        return out


def make_fattree(options: dict[str, Any], params: Any) -> FatTree:
    from dlcomm.plan.topology.base import take_options

    opts, params = take_options("fattree", options, {"n": int, "taper": float,
                                                     "ina": _flag}, params)
    if "n" not in opts:
        raise ConfigError("fattree needs n=ACCELERATORS")
    return FatTree(opts["n"], opts.get("taper", 0.0), opts.get("ina", False), params=params)


def _flag(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)
