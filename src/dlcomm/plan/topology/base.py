"""What every topology provides: parameters, exact counts, a graph, bisection, all-reduce.

Conventions shared by all topologies:

- Accelerators have ``ports`` network ports of ``rate_gbps`` each (full duplex); the
  injection bandwidth of an accelerator is ports x rate (one direction).
- Graph nodes: accelerators are the integers 0..N-1 in the topology's natural order
  (neighbours in that order are close in the network; placement uses it), with
  ``kind="acc"``; switches have ``kind="switch"`` (``level``, ``role``); a non-blocking
  fat tree collapsed into one node has ``kind="xbar"``. Edges are full-duplex links with
  ``capacity`` (Gb/s per direction; parallel links merged, ``links`` counts them),
  ``cable`` (trace | dac | aoc) and optionally ``order`` (routing order, see flownet).
- Cables: ``trace`` = board wiring (no cable), ``dac`` = electrical direct-attach copper
  (short, inside a rack), ``aoc`` = active optical cable (long, between racks).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dlcomm.errors import ConfigError
from dlcomm.registry import parse_rate, reject_unknown, take_option

__all__ = ["CABLE_KINDS", "LinkParams", "SwitchGroup", "Counts", "Topology", "AllreduceChoice",
           "take_options", "add_link", "merge_groups", "param_suffix"]


CABLE_KINDS = {"dac": {"medium": "electrical", "length": "short"},
               "aoc": {"medium": "optical", "length": "long"}}


@dataclass(frozen=True)
class LinkParams:
    rate_gbps: float = 400.0   # one link (one port), one direction
    ports: int = 4             # network ports per accelerator
    radix: int = 64            # ports per switch

    def __post_init__(self) -> None:
        if not self.rate_gbps > 0:
            raise ConfigError(f"link rate must be > 0 Gb/s, got {self.rate_gbps}")
        if self.ports < 1:
            raise ConfigError(f"ports per accelerator must be >= 1, got {self.ports}")
        if self.radix < 4:
            raise ConfigError(f"switch radix must be >= 4, got {self.radix}")

    @property
    def injection_gbps(self) -> float:
        return self.ports * self.rate_gbps


@dataclass(frozen=True)
class SwitchGroup:
    role: str          # leaf | spine | aggregation | core | router | ...
    level: int         # 1 = the switches accelerators attach to
    radix: int
    count: int
    ports_used: int    # over the whole group


@dataclass(frozen=True)
class Counts:
    accelerators: int
    accelerator_ports: int     # accelerators x ports
    switched_ports: int        # accelerator ports attached to a switch port
    nic_ports: int             # accelerator ports that drive a cable (DAC or AOC)
    long_cable_ports: int      # accelerator ports on an optical (long) cable
    trace_links: int           # accelerator-accelerator links in board traces
    switches: tuple[SwitchGroup, ...]
    cables: dict[str, int]     # "dac": electrical short, "aoc": optical long

    @property
    def switch_count(self) -> int:
        return sum(g.count for g in self.switches)

    @property
    def switch_ports_used(self) -> int:
        return sum(g.ports_used for g in self.switches)

    @property
    def switch_ports_total(self) -> int:
        return sum(g.count * g.radix for g in self.switches)

    def to_dict(self) -> dict[str, Any]:
        return {"accelerators": self.accelerators,
                "accelerator_ports": self.accelerator_ports,
                "switched_ports": self.switched_ports, "nic_ports": self.nic_ports,
                "long_cable_ports": self.long_cable_ports, "trace_links": self.trace_links,
                "switches": [g.__dict__ for g in self.switches],
                "switch_count": self.switch_count,
                "switch_ports_used": self.switch_ports_used,
                "switch_ports_total": self.switch_ports_total,
                "cables": dict(self.cables), "cable_kinds": CABLE_KINDS}


@dataclass(frozen=True)
class AllreduceChoice:
    algorithm: str     # e.g. "ring", "rabenseifner", "torus-rings", "hierarchical", "ina"
    seconds: float


@dataclass(frozen=True)
class Topology(abc.ABC):
    """A network of accelerators. Subclasses are frozen dataclasses, one per file."""

    kind: ClassVar[str]
    params: LinkParams = field(default_factory=LinkParams, kw_only=True)

    @property
    @abc.abstractmethod
    def accelerators(self) -> int: ...

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Display name, e.g. "Hx2Mesh 16x16 boards of 2x2"."""

    @property
    @abc.abstractmethod
    def spec(self) -> str:
        """The registry spec that builds this topology again."""

    @abc.abstractmethod
    def counts(self) -> Counts: ...

    @abc.abstractmethod
    def graph(self, detail: str = "logical") -> Any:
        """networkx graph. ``logical``: non-blocking fat trees collapsed into one node
        (for flow analysis); ``switches``: every switch (for counting and min-cuts)."""

    @abc.abstractmethod
    def bisection_gbps(self) -> float:
        """Closed-form bisection bandwidth (one direction, Gb/s)."""

    @abc.abstractmethod
    def bisection_halves(self) -> tuple[list[int], list[int]]:
        """The two accelerator halves of the cut that ``bisection_gbps`` describes."""

    @abc.abstractmethod
    def allreduce_candidates(self, nbytes: float, alpha: float) -> list[AllreduceChoice]:
        """Time of each all-reduce algorithm that suits this topology (all accelerators)."""

    @property
    def injection_gbps(self) -> float:
        return self.params.injection_gbps

    def best_allreduce(self, nbytes: float, alpha: float) -> AllreduceChoice:
        return min(self.allreduce_candidates(nbytes, alpha), key=lambda c: c.seconds)

    def _bytes_per_s(self, gbps: float) -> float:
        return gbps * 1e9 / 8


def _rate(value: str) -> float:
    try:
        return float(value)                       # a plain number is Gb/s
    except ValueError:
        return parse_rate(value) / 1e9


def take_options(kind: str, options: dict[str, str], allowed: dict[str, Callable[[str], Any]],
                 params: LinkParams) -> tuple[dict[str, Any], LinkParams]:
    """Convert a spec's options; ``rate``, ``ports`` and ``radix`` override ``params``."""
    common: dict[str, Callable[[str], Any]] = {"rate": _rate, "ports": int, "radix": int}
    owner = f"topology {kind!r}"
    rest = dict(options)
    over = {k: take_option(rest, k, cast, None, owner) for k, cast in common.items() if k in rest}
    out = {k: take_option(rest, k, cast, None, owner) for k, cast in allowed.items() if k in rest}
    reject_unknown(rest, owner, sorted([*allowed, *common]))
    params = LinkParams(over.get("rate", params.rate_gbps), over.get("ports", params.ports),
                        over.get("radix", params.radix))
    return out, params


def param_suffix(params: LinkParams) -> str:
    """Spec options for the link parameters that differ from the defaults."""
    default = LinkParams()
    parts = [f"rate={params.rate_gbps:g}" if params.rate_gbps != default.rate_gbps else "",
             f"ports={params.ports}" if params.ports != default.ports else "",
             f"radix={params.radix}" if params.radix != default.radix else ""]
    return "".join("," + p for p in parts if p)


def add_link(graph: Any, u: Any, v: Any, capacity: float, cable: str, links: int = 1,
             order: int = 0) -> None:
    """Add a full-duplex link; parallel links between u and v merge (capacities add)."""
    if graph.has_edge(u, v):
        data = graph.edges[u, v]
        data["capacity"] += capacity
        data["links"] += links
    else:
        graph.add_edge(u, v, capacity=capacity, cable=cable, links=links, order=order)


def merge_groups(groups: list[SwitchGroup]) -> tuple[SwitchGroup, ...]:
    """Sum switch groups that share role, level and radix."""
    merged: dict[tuple[str, int, int], list[int]] = {}
    for g in groups:
        acc = merged.setdefault((g.role, g.level, g.radix), [0, 0])
        acc[0] += g.count
        acc[1] += g.ports_used
    return tuple(SwitchGroup(role, level, radix, c, p)
                 for (role, level, radix), (c, p) in sorted(merged.items(),
                                                            key=lambda kv: kv[0][1]))
