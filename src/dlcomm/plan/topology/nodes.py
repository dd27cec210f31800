"""Servers of accelerators on a fabric: NVSwitch inside every node, a fat tree between them.

``nodes:n=1024,node=dgx-a100`` is 128 DGX A100 (``dlcomm.workloads.accelerators.NODES``):
per node one NVSwitch domain that every GPU reaches at its NVLink rate, and per GPU one NIC
on a non-blocking fat tree (collapsed into one crossbar, as ``fattree`` does; ``radix``
sizes its switches for the counts). ``gpus``, ``nvlink`` and ``nic`` (Gb/s per GPU, one
direction) override the node's figures.

Graph (links carry the *effective* rate, line rate x the node's link efficiency, since the
simulator moves payload bytes on them): GPU i of node k -- ("nvs", k) on board traces;
GPU i -- ("nic", i) -- the fabric. Inside a node the NVSwitch path (2 hops) is the shortest,
between nodes the NIC path (4 hops): traffic never leaves a node to reach a neighbour, and
never crosses NVLink to borrow another GPU's NIC. Translations over (node, position) make
every GPU a translate of GPU 0 (fast routing at thousands of GPUs).

Closed forms (h GPUs per node, B_in NVLink and B_nic NIC effective rates): bisection
n/2 x nic line rate (one node: n/2 x nvlink); all-reduce with NCCL's rings (``rails:h``): bus
bandwidth B_in on one node, min(B_in h / (h - 1), h B_nic) across nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan.topology.base import (
    AllreduceChoice,
    Counts,
    LinkParams,
    Topology,
    add_link,
    take_options,
)
from dlcomm.plan.topology.fattree import FatTree
from dlcomm.workloads.accelerators import NODES, NodeSpec

__all__ = ["Nodes", "make_nodes"]


@dataclass(frozen=True)
class Nodes(Topology):
    kind = "nodes"
    n: int                  # accelerators (rounded up to whole nodes)
    node: NodeSpec

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ConfigError(f"nodes needs >= 2 accelerators, got n={self.n}")
        if self.node.gpus < 1 or not (self.node.scaleup_gbps > 0 and self.node.nic_gbps > 0):
            raise ConfigError("a node needs >= 1 GPU and positive NVLink and NIC rates")

    @property
    def nodes(self) -> int:
        return math.ceil(self.n / self.node.gpus)

    @property
    def accelerators(self) -> int:
        return self.nodes * self.node.gpus

    @property
    def inside_gbps(self) -> float:
        return self.node.scaleup_gbps * self.node.scaleup_efficiency

    @property
    def nic_gbps(self) -> float:
        return self.node.nic_gbps * self.node.nic_efficiency

    @cached_property
    def fabric(self) -> FatTree:
        return FatTree(self.accelerators, params=LinkParams(self.node.nic_gbps, 1,
                                                            self.params.radix))

    @property
    def name(self) -> str:
        return f"{self.nodes} x {self.node.name} on a non-blocking fat tree"

    @property
    def spec(self) -> str:
        return (f"nodes:n={self.accelerators},node={self.node.name},gpus={self.node.gpus},"
                f"nvlink={self.node.scaleup_gbps:g},nic={self.node.nic_gbps:g},"
                f"radix={self.params.radix}")

    @property
    def injection_gbps(self) -> float:
        return self.node.nic_gbps

    def counts(self) -> Counts:
        """The fabric's switches and cables (the NVSwitches are part of the node's price)."""
        return self.fabric.counts()

    def graph(self, detail: str = "logical") -> Any:
        import networkx as nx

        if detail not in ("logical", "switches"):
            raise ConfigError(f"unknown graph detail {detail!r} (logical, switches)")
        h, nodes = self.node.gpus, self.nodes
        g = nx.Graph(name=self.name)
        g.graph["translations"] = (0, nodes, h)
        g.add_node(("xbar",), kind="xbar", pos=(3, -1, -1))
        for k in range(nodes):
            g.add_node(("nvs", k), kind="switch", level=0, role="nvswitch", pos=(2, k, -1))
        for i in range(self.accelerators):
            k, j = divmod(i, h)
            g.add_node(i, kind="acc", pos=(0, k, j))
            g.add_node(("nic", i), kind="nic", pos=(1, k, j))
            add_link(g, i, ("nvs", k), self.inside_gbps, "trace")
            add_link(g, i, ("nic", i), self.nic_gbps, "trace")
            add_link(g, ("nic", i), ("xbar",), self.nic_gbps, "aoc")
        return g

    def bisection_gbps(self) -> float:
        """Line rates, as every topology reports them."""
        if self.nodes == 1:
            return self.accelerators / 2 * self.node.scaleup_gbps
        return self.accelerators / 2 * self.node.nic_gbps

    def bisection_halves(self) -> tuple[list[int], list[int]]:
        n = self.accelerators
        return list(range(n // 2)), list(range(n // 2, n))

    def bus_gbps(self) -> float:
        """All-reduce bus bandwidth of NCCL's rings over every GPU (module docstring)."""
        h = self.node.gpus
        if self.nodes == 1:
            return self.inside_gbps
        inside = self.inside_gbps * h / (h - 1) if h > 1 else math.inf
        return min(inside, h * self.nic_gbps)

    def allreduce_candidates(self, nbytes: float, alpha: float) -> list[AllreduceChoice]:
        n = self.accelerators
        t = 2 * (n - 1) / n * nbytes / self._bytes_per_s(self.bus_gbps()) + 2 * (n - 1) * alpha
        return [AllreduceChoice(f"rails:{self.node.gpus}", t)]


def make_nodes(options: dict[str, Any], params: Any) -> Nodes:
    if {"rate", "ports"} & set(options):
        raise ConfigError("nodes takes its link rates from node=, nvlink= and nic= "
                          "(not rate= or ports=)")
    opts, params = take_options("nodes", options, {"n": int, "node": str, "gpus": int,
                                                   "nvlink": float, "nic": float}, params)
    if "n" not in opts:
        raise ConfigError("nodes needs n=ACCELERATORS")
    for key in ("nvlink", "nic"):
        if key in opts and not 0 < opts[key] < float("inf"):
            raise ConfigError(f"nodes {key}= must be a positive rate in Gb/s, got {opts[key]}")
    node = NODES.get(opts.get("node", "dgx-a100"))()
    node = replace(node, gpus=opts.get("gpus", node.gpus),
                   scaleup_gbps=opts.get("nvlink", node.scaleup_gbps),
                   nic_gbps=opts.get("nic", node.nic_gbps))
    return Nodes(opts["n"], node, params=params)
