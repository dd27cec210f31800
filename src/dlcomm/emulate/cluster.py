"""Create, inspect and tear down emulated clusters (the thin I/O shell around :mod:`.plan`).

Teardown is guaranteed three ways: :func:`temporary_cluster` is a context manager whose
exit (normal, exception, SIGINT/SIGTERM/SIGHUP turned into an exception) deletes every
namespace it made; namespaces of runs whose owning process died (``dlcomm-p{PID}-...``)
are collected by the next run; and ``dlcomm cluster down`` removes any leftover.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import psutil

from dlcomm.emulate.plan import (
    PREFIX,
    ClusterPlan,
    ClusterSpec,
    plan_cluster,
    setup_commands,
    teardown_commands,
)
from dlcomm.errors import ConfigError, DlcommError
from dlcomm.runtime.signals import interrupts_ignored, interrupts_raised

__all__ = ["Cluster", "temporary_cluster", "require_root", "list_namespaces",
           "remove_namespaces", "stale_namespaces", "interface_counters", "STATE_DIR",
           "saved_cluster", "ClusterError"]

STATE_DIR = Path(os.environ.get("DLCOMM_STATE_DIR", "/run/dlcomm"))
_OWNED = re.compile(rf"{PREFIX}p(\d+)-")


class ClusterError(DlcommError):
    """An ip/tc command failed while building or inspecting an emulated cluster."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise ConfigError("the emulated network needs root (network namespaces, tc); "
                          "run as root or use --network loopback")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ConfigError(f"the emulated network needs `{tool}` (iproute2), not found")


def _run(argv: list[str]) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"{' '.join(argv)}: {exc}") from exc
    if res.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed: {res.stderr.strip()}")
    return res.stdout


def list_namespaces() -> list[str]:
    """All dlcomm namespaces on this machine."""
    out = _run(["ip", "-j", "netns", "list"]) or "[]"
    return sorted(ns["name"] for ns in json.loads(out) if ns["name"].startswith(PREFIX))


def remove_namespaces(namespaces: list[str]) -> list[str]:
    """Delete namespaces (and with them their links); kill what still runs inside first."""
    removed = []
    for ns in namespaces:
        with contextlib.suppress(ClusterError):
            pids = _run(["ip", "netns", "pids", ns]).split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for argv in teardown_commands([ns]):
            with contextlib.suppress(ClusterError):
                _run(argv)
                removed.append(ns)
    return removed


def stale_namespaces(namespaces: list[str]) -> list[str]:
    """Namespaces of temporary clusters whose owning process is gone."""
    stale = []
    for ns in namespaces:
        m = _OWNED.match(ns)
        if m and not psutil.pid_exists(int(m.group(1))):
            stale.append(ns)
    return stale


def interface_counters(ns: str, dev: str = "eth0") -> dict[str, int]:
    """Bytes and packets through ``dev`` in ``ns`` (kernel counters: true wire bytes)."""
    stats = json.loads(_run(["ip", "-n", ns, "-s", "-j", "link", "show", dev]))[0]["stats64"]
    return {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
            "tx_packets": stats["tx"]["packets"], "rx_packets": stats["rx"]["packets"],
            "tx_dropped": stats["tx"]["dropped"], "rx_dropped": stats["rx"]["dropped"]}


class Cluster:
    """A built emulated cluster."""

    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan

    @classmethod
    def create(cls, spec: ClusterSpec) -> Cluster:
        """Build the cluster; on any failure remove what was built and raise."""
        require_root()
        plan = plan_cluster(spec)
        existing = list_namespaces()
        remove_namespaces(stale_namespaces(existing))
        clash = sorted(set(plan.namespaces) & set(existing))
        if clash:
            raise ConfigError(f"emulated cluster {spec.name!r} already exists ({clash[0]}); "
                              "use `dlcomm cluster down` first")
        try:
            for argv in setup_commands(plan):
                _run(argv)
        except BaseException:
            with interrupts_ignored():
                remove_namespaces(list(plan.namespaces))
            raise
        return cls(plan)

    def destroy(self) -> None:
        remove_namespaces(list(self.plan.namespaces))

    def prefix(self, rank: int) -> list[str]:
        """Command prefix that runs a process on the host of ``rank``."""
        return ["ip", "netns", "exec", self.plan.host_of(rank)]

    def core_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.plan.core]

    def address(self, rank: int) -> str:
        return self.plan.addresses[rank % len(self.plan.addresses)]

    def counters(self) -> list[dict[str, int]]:
        return [interface_counters(ns) for ns in self.plan.hosts]

    def describe(self) -> dict:
        spec = self.plan.spec
        return {"name": spec.name, "hosts": spec.hosts, "rate_bps": spec.rate_bps,
                "topology": spec.topology, "mtu": spec.mtu, "core": self.plan.core,
                "addresses": list(self.plan.addresses), "latency_emulated": False,
                "shaping": "tc tbf on both ends of every link; netem (latency, loss) is "
                           "not available, so latency is not emulated"}


@contextlib.contextmanager
def temporary_cluster(hosts: int, bandwidth_bps: float, topology: str = "star",
                      mtu: int = 9000) -> Iterator[Cluster]:
    """A cluster owned by this process, removed on exit, exception or SIGINT/SIGTERM/SIGHUP.

    The signal handlers are in place before the first namespace is made, so a signal while
    the cluster is being built also removes what was built (:meth:`Cluster.create`)."""
    spec = ClusterSpec(f"p{os.getpid()}", hosts, bandwidth_bps, topology, mtu)
    with interrupts_raised():
        cluster = Cluster.create(spec)
        try:
            yield cluster
        finally:
            with interrupts_ignored():
                cluster.destroy()


def _state_file(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


def save_cluster(cluster: Cluster) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    _state_file(cluster.plan.spec.name).write_text(json.dumps(asdict(cluster.plan.spec)))


def saved_cluster(name: str) -> Cluster:
    """A cluster made earlier by ``dlcomm cluster up --name NAME``."""
    try:
        spec = ClusterSpec(**json.loads(_state_file(name).read_text()))
    except FileNotFoundError:
        raise ConfigError(f"no emulated cluster {name!r} (see `dlcomm cluster status`)") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"state of emulated cluster {name!r} is corrupt: {exc}") from exc
    plan = plan_cluster(spec)
    missing = set(plan.namespaces) - set(list_namespaces())
    if missing:
        raise ConfigError(f"emulated cluster {name!r} is incomplete (missing {sorted(missing)[0]});"
                          " run `dlcomm cluster down` and up again")
    return Cluster(plan)


def forget_cluster(name: str) -> bool:
    """Drop the saved state of cluster ``name``; whether there was one."""
    try:
        _state_file(name).unlink()
    except FileNotFoundError:
        return False
    return True
