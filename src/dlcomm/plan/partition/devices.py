"""Heterogeneous clusters for the partition planner: groups of accelerators and their links.

A cluster is an ordered list of groups, ``tpu-v2:64,tpu-v3:64``; each group is ``count``
devices of one accelerator from the catalog (workloads/accelerators.py: peak FLOP/s,
memory, links, efficiency, sources) or from a user file. The binary hierarchy splits the
device list in halves in this order, so the first split of ``tpu-v2:64,tpu-v3:64`` puts
the TPU-v2s on one side and the TPU-v3s on the other.

Links (one way, per device; a side's bandwidth is its device count times its link):

- inside one group: the accelerator's scale-up link (TPU ICI, NVLink), ``scaleup_gbps``;
- across groups: ``between_gbps`` if given (e.g. a data-centre network between two pods),
  else each side keeps its own scale-up link, as in AccPar's single heterogeneous array.

A cluster file (TOML or JSON) names the groups, optionally the link between groups, and
optionally defines accelerators in the catalog's file format::

    devices = "tpu-v2:64,npu:64"        # or [{device = "tpu-v2", count = 64}, ...]
    between_gbps = 100                  # optional
    [accelerators.npu]
    peak_flops = 2.0e14
    memory_gb = 48
    scaleup_gbps = 800
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError, RegistryError
from dlcomm.plan.partition.costs import Sides
from dlcomm.results import read_table_file
from dlcomm.workloads.accelerators import (
    ACCELERATORS,
    Accelerator,
    get_accelerator,
    load_accelerators,
)

__all__ = ["Group", "Cluster", "parse_devices", "load_cluster", "make_cluster"]


@dataclass(frozen=True)
class Group:
    accelerator: Accelerator
    count: int


@dataclass(frozen=True)
class Cluster:
    groups: tuple[Group, ...]
    between_gbps: float | None = None   # per device, one way, across groups

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("a cluster needs at least one group of devices")
        for g in self.groups:
            if g.count < 1:
                raise ConfigError(f"group {g.accelerator.name}:{g.count} needs >= 1 device")
            if g.accelerator.scaleup_gbps <= 0:
                raise ConfigError(f"accelerator {g.accelerator.name!r} has no scaleup_gbps")
        if self.between_gbps is not None and self.between_gbps <= 0:
            raise ConfigError(f"between_gbps must be positive, got {self.between_gbps}")
        group_of = np.repeat(np.arange(len(self.groups)), [g.count for g in self.groups])
        object.__setattr__(self, "_group_of", group_of)

    @property
    def size(self) -> int:
        return sum(g.count for g in self.groups)

    def spec(self) -> str:
        return ",".join(f"{g.accelerator.name}:{g.count}" for g in self.groups)

    def runs(self, lo: int, hi: int) -> tuple[tuple[str, int, int], ...]:
        """(accelerator, count, group) runs of devices ``lo..hi-1``."""
        out: list[tuple[str, int, int]] = []
        for g in self._group_of[lo:hi]:
            if out and out[-1][2] == g:
                out[-1] = (out[-1][0], out[-1][1] + 1, int(g))
            else:
                out.append((self.groups[g].accelerator.name, 1, int(g)))
        return tuple(out)

    def signature(self, lo: int, hi: int) -> tuple[tuple[str, int], ...]:
        """What a device slice is made of, for recognising identical subtrees."""
        return tuple((name, count) for name, count, _ in self.runs(lo, hi))

    def describe(self, lo: int, hi: int) -> str:
        return "+".join(f"{name} x{count}" for name, count, _ in self.runs(lo, hi))

    def accelerator(self, index: int) -> Accelerator:
        return self.groups[int(self._group_of[index])].accelerator

    def sides(self, parts: list[tuple[int, int]]) -> Sides:
        """Throughput, bandwidth, device count and memory of each part of a node."""
        lo, hi = parts[0][0], parts[-1][1]
        spans_groups = len(set(self._group_of[lo:hi].tolist())) > 1
        flops, bandwidth, devices, memory = [], [], [], []
        for a, b in parts:
            accs = [self.groups[g].accelerator for g in self._group_of[a:b]]
            link = (self.between_gbps if spans_groups and self.between_gbps is not None
                    else min(x.scaleup_gbps for x in accs))
            flops.append(sum(x.peak_flops * x.efficiency for x in accs))
            bandwidth.append(link * 1e9 / 8 * (b - a))
            devices.append(b - a)
            memory.append(min(x.memory_bytes for x in accs))
        return Sides(np.array(flops), np.array(bandwidth), np.array(devices, dtype=float),
                     np.array(memory))


def _accelerator(name: str, custom: dict[str, Accelerator],
                 efficiency: float | None) -> Accelerator:
    if name in custom:
        acc = custom[name]
        return acc if efficiency is None else replace(acc, efficiency=efficiency)
    if name not in ACCELERATORS:
        known = ", ".join(sorted({*ACCELERATORS.names(), *custom}))
        raise RegistryError(f"unknown accelerator {name!r} (known: {known})")
    return get_accelerator(name, efficiency)


def parse_devices(spec: str | list[Any], custom: dict[str, Accelerator] | None = None,
                  efficiency: float | None = None) -> tuple[Group, ...]:
    """Groups from ``name:count,name:count`` (or a list of {device, count} tables)."""
    custom = custom or {}
    if efficiency is not None and not 0 < efficiency <= 1:
        raise ConfigError(f"efficiency must be in (0, 1], got {efficiency}")
    items: list[tuple[str, Any]] = []
    if isinstance(spec, str):
        for part in filter(None, (x.strip() for x in spec.split(","))):
            name, _, count = part.partition(":")
            items.append((name.strip(), count.strip() or "1"))
    elif isinstance(spec, list):
        for entry in spec:
            if not isinstance(entry, dict) or "device" not in entry:
                raise ConfigError(f"bad device group {entry!r} (expected device and count)")
            items.append((str(entry["device"]), entry.get("count", 1)))
    else:
        raise ConfigError(f"bad devices {spec!r} (example: tpu-v2:64,tpu-v3:64)")
    if not items:
        raise ConfigError("no devices given (example: tpu-v2:64,tpu-v3:64)")
    groups = []
    for name, count in items:
        try:
            n = int(count)
        except (TypeError, ValueError):
            raise ConfigError(f"bad device count {count!r} for {name!r} "
                              "(example: tpu-v2:64)") from None
        if n < 1:
            raise ConfigError(f"device count for {name!r} must be >= 1, got {n}")
        groups.append(Group(_accelerator(name, custom, efficiency), n))
    return tuple(groups)


_FILE_KEYS = {"devices", "between_gbps", "accelerators"}


def load_cluster(path: str | Path) -> dict[str, Any]:
    """Read a cluster file: ``{"devices": ..., "between_gbps": ..., "custom": {...}}``."""
    p = Path(path)
    data = read_table_file(p, "cluster file")
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise ConfigError(f"cluster file {p}: unknown keys {unknown} (known: "
                          f"{sorted(_FILE_KEYS)})")
    custom = load_accelerators(p) if "accelerators" in data else {}
    between = data.get("between_gbps")
    if between is not None and not isinstance(between, (int, float)):
        raise ConfigError(f"cluster file {p}: between_gbps must be a number")
    return {"devices": data.get("devices"), "between_gbps": between, "custom": custom}


def make_cluster(devices: str | None = None, cluster_file: str | None = None,
                 between_gbps: float | None = None,
                 efficiency: float | None = None) -> Cluster:
    """A cluster from ``--devices`` and/or ``--cluster FILE`` (the command line wins)."""
    file = load_cluster(cluster_file) if cluster_file else {"devices": None,
                                                            "between_gbps": None, "custom": {}}
    spec = devices if devices is not None else file["devices"]
    if spec is None:
        raise ConfigError("no devices: give --devices (e.g. tpu-v2:64,tpu-v3:64) or a "
                          "cluster file with 'devices'")
    groups = parse_devices(spec, file["custom"], efficiency)
    between = between_gbps if between_gbps is not None else file["between_gbps"]
    return Cluster(groups, None if between is None else float(between))
