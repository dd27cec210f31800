"""The plan of an emulated cluster: namespaces, links, addresses and shaping, as pure data.

A cluster of ``hosts`` worker hosts, each a network namespace with one interface ``eth0``,
joined through Linux bridges in "switch" namespaces by veth links:

- ``star``: one switch namespace ``sw`` holding bridge ``br0``; host i <-> ``sw`` port ``p{i}``.
- ``leafspine:R:H:O``: R leaf namespaces (``leaf{r}``), H hosts each, and one ``spine``;
  leaf r <-> spine by one uplink shaped at H * rate / O (oversubscription O).

Every link is shaped with ``tc tbf`` in both directions (each veth end shapes its egress).
Interfaces use jumbo frames (MTU 9000) unless asked otherwise, and each namespace gets a
256 MB IP reassembly budget for large UDP datagrams.
netem is not available on the machines dlcomm targets, so latency is *not* emulated.
The aggregation switch service runs in the core switch namespace (``sw`` or ``spine``), whose
bridge carries the address :data:`SWITCH_HOST`.

:func:`setup_commands` and :func:`teardown_commands` turn a plan into ``ip``/``tc`` argv
lists; :mod:`dlcomm.emulate.cluster` runs them.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from dlcomm.errors import ConfigError
from dlcomm.registry import parse_rate

__all__ = ["ClusterSpec", "Link", "ClusterPlan", "plan_cluster", "setup_commands",
           "teardown_commands", "PREFIX", "SUBNET", "SWITCH_HOST", "parse_topology",
           "tbf_burst_bytes", "host_address"]

PREFIX = "dlcomm-"
SUBNET = ipaddress.IPv4Network("10.77.0.0/16")
SWITCH_HOST = "10.77.255.254"  # the core switch namespace's bridge address
MAX_HOSTS = 4000
REASSEMBLY_BYTES = 256 << 20
_NAME_RE = re.compile(r"[a-z0-9]{1,12}")


def check_cluster_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(f"cluster name {name!r} must be 1-12 of [a-z0-9]")
    return name


@dataclass(frozen=True)
class ClusterSpec:
    """What the user asks for."""

    name: str                  # short tag; namespaces are named dlcomm-{name}-...
    hosts: int
    rate_bps: float            # every host link, each direction
    topology: str = "star"     # "star" or "leafspine:RACKS:HOSTS_PER_RACK:OVERSUB"
    mtu: int = 9000            # every interface: jumbo frames, as training networks use

    def __post_init__(self) -> None:
        check_cluster_name(self.name)
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise ConfigError(f"an emulated cluster has 1..{MAX_HOSTS} hosts, got {self.hosts}")
        if not self.rate_bps >= 1e5:
            raise ConfigError(f"link rate must be at least 100kbit, got {self.rate_bps:g} bit/s")
        parse_topology(self.topology, self.hosts)
        if not 576 <= self.mtu <= 65535:
            raise ConfigError(f"MTU must be in 576..65535, got {self.mtu}")

    @classmethod
    def from_options(cls, name: str, hosts: int, bandwidth: str, topology: str = "star",
                     mtu: int = 9000) -> ClusterSpec:
        return cls(name, hosts, parse_rate(bandwidth), topology, mtu)


def parse_topology(text: str, hosts: int) -> tuple[int, int, float]:
    """``star`` -> (1, hosts, 1.0); ``leafspine:R:H:O`` -> (R, H, O), checked against hosts."""
    if text == "star":
        return 1, hosts, 1.0
    parts = text.split(":")
    if len(parts) != 4 or parts[0] != "leafspine":
        raise ConfigError(f"unknown topology {text!r} (star or leafspine:RACKS:HOSTS:OVERSUB)")
    try:
        racks, per_rack, oversub = int(parts[1]), int(parts[2]), float(parts[3])
    except ValueError:
        raise ConfigError(f"bad topology {text!r}: RACKS, HOSTS are integers, "
                          "OVERSUB a number") from None
    if racks < 1 or per_rack < 1 or not oversub >= 1:
        raise ConfigError(f"bad topology {text!r}: need RACKS >= 1, HOSTS >= 1, OVERSUB >= 1")
    if racks * per_rack != hosts:
        raise ConfigError(f"topology {text!r} has {racks * per_rack} hosts, "
                          f"but {hosts} were asked for")
    return racks, per_rack, oversub


@dataclass(frozen=True)
class Link:
    """A veth pair ``a_ns/a_if`` <-> ``b_ns/b_if``, each end shaped at ``rate_bps`` egress."""

    a_ns: str
    a_if: str
    b_ns: str
    b_if: str
    rate_bps: float
    bridge_b: bool = True      # b_if is enslaved to b_ns's bridge
    bridge_a: bool = False     # a_if is enslaved to a_ns's bridge (switch-to-switch links)


@dataclass(frozen=True)
class ClusterPlan:
    spec: ClusterSpec
    hosts: tuple[str, ...]           # host namespaces, rank order
    switches: tuple[str, ...]        # namespaces with a bridge br0
    core: str                        # the namespace where the aggregation switch runs
    links: tuple[Link, ...]
    addresses: tuple[str, ...]       # host i's address

    @property
    def namespaces(self) -> tuple[str, ...]:
        return self.hosts + self.switches

    def host_of(self, rank: int) -> str:
        return self.hosts[rank % len(self.hosts)]


def host_address(i: int) -> str:
    return str(SUBNET.network_address + 1 + i)


def plan_cluster(spec: ClusterSpec) -> ClusterPlan:
    """Lay out namespaces, links and addresses for ``spec`` (pure)."""
    base = f"{PREFIX}{spec.name}-"
    hosts = tuple(f"{base}h{i}" for i in range(spec.hosts))
    racks, per_rack, oversub = parse_topology(spec.topology, spec.hosts)
    links: list[Link] = []
    if spec.topology == "star":
        core = f"{base}sw"
        switches: tuple[str, ...] = (core,)
        links = [Link(h, "eth0", core, f"p{i}", spec.rate_bps) for i, h in enumerate(hosts)]
    else:
        core = f"{base}spine"
        leaves = tuple(f"{base}leaf{r}" for r in range(racks))
        switches = leaves + (core,)
        for i, h in enumerate(hosts):
            links.append(Link(h, "eth0", leaves[i // per_rack], f"p{i % per_rack}",
                              spec.rate_bps))
        uplink = per_rack * spec.rate_bps / oversub
        links += [Link(leaf, "uplink", core, f"l{r}", uplink, bridge_a=True)
                  for r, leaf in enumerate(leaves)]
    return ClusterPlan(spec, hosts, switches, core, tuple(links),
                       tuple(host_address(i) for i in range(spec.hosts)))


def tbf_burst_bytes(rate_bps: float) -> int:
    """Token-bucket depth: 4 ms at the link rate, at least 64 KiB (one GSO segment)."""
    return max(64 * 1024, int(rate_bps / 8 * 0.004))


def _tbf(ns: str, dev: str, rate_bps: float) -> list[str]:
    return ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
            "rate", f"{int(rate_bps)}bit", "burst", str(tbf_burst_bytes(rate_bps)),
            "latency", "50ms"]


def setup_commands(plan: ClusterPlan) -> list[list[str]]:
    """The ``ip``/``tc`` commands that build ``plan``, in order."""
    cmds: list[list[str]] = []
    for ns in plan.namespaces:
        cmds += [["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"]]
    mtu = str(plan.spec.mtu)
    for ns in plan.switches:
        cmds += [["ip", "-n", ns, "link", "add", "br0", "type", "bridge"],
                 ["ip", "-n", ns, "link", "set", "dev", "br0", "mtu", mtu],
                 ["ip", "-n", ns, "link", "set", "br0", "up"]]
    cmds.append(["ip", "-n", plan.core, "addr", "add", f"{SWITCH_HOST}/{SUBNET.prefixlen}",
                 "dev", "br0"])
    for link in plan.links:
        cmds.append(["ip", "-n", link.b_ns, "link", "add", link.b_if, "type", "veth",
                     "peer", "name", link.a_if, "netns", link.a_ns])
        for ns, dev, bridged in ((link.a_ns, link.a_if, link.bridge_a),
                                 (link.b_ns, link.b_if, link.bridge_b)):
            cmds.append(["ip", "-n", ns, "link", "set", "dev", dev, "mtu", mtu])
            if bridged:
                cmds.append(["ip", "-n", ns, "link", "set", "dev", dev, "master", "br0"])
            cmds += [["ip", "-n", ns, "link", "set", "dev", dev, "up"],
                     _tbf(ns, dev, link.rate_bps)]
    for ns, addr in zip(plan.hosts, plan.addresses):
        cmds.append(["ip", "-n", ns, "addr", "add", f"{addr}/{SUBNET.prefixlen}", "dev", "eth0"])
    for ns in plan.namespaces:
        # UDP datagrams above the MTU travel as IP fragments; a whole window of them from
        # every worker must fit the reassembly budget (4 MB by default), or the kernel
        # evicts queued fragments and every datagram in flight is lost.
        cmds.append(["ip", "netns", "exec", ns, "sysctl", "-qw",
                     f"net.ipv4.ipfrag_high_thresh={REASSEMBLY_BYTES}",
                     f"net.ipv4.ipfrag_low_thresh={REASSEMBLY_BYTES * 3 // 4}"])
    return cmds


def teardown_commands(namespaces: list[str] | tuple[str, ...]) -> list[list[str]]:
    """Deleting a namespace deletes its veth ends (and so their peers) and bridges."""
    return [["ip", "netns", "delete", ns] for ns in namespaces]
