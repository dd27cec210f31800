"""Where a job's processes run: on this host's loopback, or on an emulated cluster.

Every command that starts workers takes the same options (``--network loopback|emulated``,
``--bandwidth``, ``--topology``, ``--cluster``) and gets a :class:`Placement`: the
rendezvous address, a command prefix and environment per rank, and the place where a
service such as the aggregation switch runs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from dlcomm.emulate.cluster import Cluster, saved_cluster, temporary_cluster
from dlcomm.emulate.plan import SWITCH_HOST, ClusterSpec
from dlcomm.errors import ConfigError
from dlcomm.registry import parse_rate

__all__ = ["NetworkOptions", "Placement", "placement"]


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


@dataclass
class Placement:
    """Where rank i runs and how it reaches the others."""

    master_addr: str
    cluster: Cluster | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def prefix(self, rank: int) -> list[str]:
        return self.cluster.prefix(rank) if self.cluster else []

    def env(self, rank: int) -> dict[str, str]:
        if self.cluster is None:
            return {}
        # gloo must use the emulated interface, not whatever the hostname resolves to;
        # c10d warns that a namespace has no resolvable hostname, which is expected here.
        return {"GLOO_SOCKET_IFNAME": "eth0", "DLCOMM_WIRE_DEV": "eth0",
                "DLCOMM_HOST_ADDR": self.cluster.address(rank), "TORCH_CPP_LOG_LEVEL": "ERROR"}

    def service_prefix(self) -> list[str]:
        """Prefix for a service in the middle of the network (the aggregation switch)."""
        return self.cluster.core_prefix() if self.cluster else []

    @property
    def service_host(self) -> str:
        return SWITCH_HOST if self.cluster else "127.0.0.1"

    def counters(self) -> list[dict[str, int]] | None:
        return self.cluster.counters() if self.cluster else None


@contextlib.contextmanager
def placement(opts: NetworkOptions, workers: int) -> Iterator[Placement]:
    """Place ``workers`` ranks as ``opts`` says; an emulated cluster lives as long as the block."""
    if opts.network == "loopback":
        yield Placement("127.0.0.1", info={"network": "loopback", "latency_emulated": False})
        return
    if opts.cluster:
        cluster = saved_cluster(opts.cluster)
        if cluster.plan.spec.hosts < workers:
            raise ConfigError(f"emulated cluster {opts.cluster!r} has "
                              f"{cluster.plan.spec.hosts} hosts, {workers} workers asked for")
        yield Placement(cluster.address(0), cluster, {"network": "emulated",
                                                       **cluster.describe()})
        return
    ClusterSpec("p0", workers, opts.rate_bps or 0.0, opts.topology, opts.mtu)  # validate first
    with temporary_cluster(workers, opts.rate_bps or 0.0, opts.topology, opts.mtu) as cluster:
        yield Placement(cluster.address(0), cluster, {"network": "emulated",
                                                      **cluster.describe()})
