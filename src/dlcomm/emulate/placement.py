"""Where a job's processes run: on this host's loopback, or on an emulated cluster.

Every command that starts workers takes the same options (``--network loopback|emulated``,
``--bandwidth``, ``--topology``, ``--cluster``) and gets a
:class:`~dlcomm.runtime.placement.Placement`: the rendezvous address, a command prefix,
environment and network namespace per rank, and the place where a service such as the
aggregation switch runs. A :class:`ClusterPlacement` puts rank i on host i of an emulated
cluster, which lives as long as the :func:`placement` block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from dlcomm.emulate.cluster import Cluster, saved_cluster, temporary_cluster
from dlcomm.emulate.plan import SWITCH_HOST, ClusterSpec
from dlcomm.errors import ConfigError
from dlcomm.registry import parse_rate
from dlcomm.runtime.placement import HOST_ADDR_ENV, WIRE_DEV_VAR, Placement

__all__ = ["NetworkOptions", "Placement", "ClusterPlacement", "placement"]


@dataclass(frozen=True)
class NetworkOptions:
    network: str = "loopback"        # "loopback" or "emulated"
    bandwidth: str | None = None     # link rate of a temporary emulated cluster, e.g. "1gbit"
    topology: str = "star"           # "star" or "leafspine:RACKS:HOSTS:OVERSUB"
    cluster: str | None = None       # use a cluster made by `dlcomm cluster up --name NAME`
    mtu: int = 9000                  # MTU of a temporary emulated cluster

    def __post_init__(self) -> None:
        if self.network not in ("loopback", "emulated"):
            raise ConfigError(f"unknown --network {self.network!r} (loopback or emulated)")
        if self.network == "loopback" and (self.bandwidth or self.cluster
                                           or self.topology != "star"):
            raise ConfigError("--bandwidth, --topology and --cluster need --network emulated")
        if self.network == "emulated" and not (self.bandwidth or self.cluster):
            raise ConfigError("--network emulated needs --bandwidth (e.g. 1gbit) or --cluster")
        if self.bandwidth:
            parse_rate(self.bandwidth)

    @property
    def rate_bps(self) -> float | None:
        return parse_rate(self.bandwidth) if self.bandwidth else None


class ClusterPlacement(Placement):
    """Rank i on host i of an emulated cluster (``ip netns exec HOST``), services in its
    core switch namespace."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster.address(0), {"network": "emulated", **cluster.describe()})
        self.cluster = cluster

    def prefix(self, rank: int) -> list[str]:
        return self.cluster.prefix(rank)

    def env(self, rank: int) -> dict[str, str]:
        # gloo must use the emulated interface, not whatever the hostname resolves to;
        # c10d warns that a namespace has no resolvable hostname, which is expected here.
        # the switch exchange sizes its packets to the links' frames (exchange/switch/spec.py)
        return {"GLOO_SOCKET_IFNAME": "eth0", WIRE_DEV_VAR: "eth0",
                HOST_ADDR_ENV: self.cluster.address(rank), "TORCH_CPP_LOG_LEVEL": "ERROR",
                "DLCOMM_PATH_MTU": str(self.cluster.plan.spec.mtu)}

    def netns(self, rank: int) -> str | None:
        return self.cluster.plan.host_of(rank)

    def service_prefix(self) -> list[str]:
        return self.cluster.core_prefix()

    @property
    def service_host(self) -> str:
        return SWITCH_HOST

    def counters(self) -> list[dict[str, int]] | None:
        return self.cluster.counters()


@contextlib.contextmanager
def placement(opts: NetworkOptions, workers: int) -> Iterator[Placement]:
    """Place ``workers`` ranks as ``opts`` says; an emulated cluster lives as long as the block."""
    if opts.network == "loopback":
        yield Placement()
        return
    if opts.cluster:
        cluster = saved_cluster(opts.cluster)
        if cluster.plan.spec.hosts < workers:
            raise ConfigError(f"emulated cluster {opts.cluster!r} has "
                              f"{cluster.plan.spec.hosts} hosts, {workers} workers asked for")
        yield ClusterPlacement(cluster)
        return
    ClusterSpec("p0", workers, opts.rate_bps or 0.0, opts.topology, opts.mtu)  # validate first
    with temporary_cluster(workers, opts.rate_bps or 0.0, opts.topology, opts.mtu) as cluster:
        yield ClusterPlacement(cluster)
