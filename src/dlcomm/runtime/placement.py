"""Where a job's ranks run and how they reach each other.

A :class:`Placement` tells the launcher, for rank i, the command prefix that puts it on its
host (``ip netns exec HOST`` on an emulated cluster), the environment it needs there, and
the network namespace whose rank 0 hosts the rendezvous; and where a service in the middle
of the network (the aggregation switch) runs. This base class is this host's loopback:
every rank and service runs here, as is. :mod:`dlcomm.emulate.placement` places ranks on an
emulated cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Placement", "LOOPBACK", "WIRE_DEV_VAR", "HOST_ADDR_ENV"]

LOOPBACK = "127.0.0.1"
WIRE_DEV_VAR = "DLCOMM_WIRE_DEV"      # the interface whose kernel counters are this host's wire
HOST_ADDR_ENV = "DLCOMM_HOST_ADDR"    # this host's own address on the job's network


@dataclass
class Placement:
    """Every rank and service on this host's loopback."""

    master_addr: str = LOOPBACK
    info: dict[str, Any] = field(default_factory=lambda: {"network": "loopback",
                                                          "latency_emulated": False})

    def prefix(self, rank: int) -> list[str]:
        """Command prefix that runs a process on the host of ``rank``."""
        return []

    def env(self, rank: int) -> dict[str, str]:
        """Environment that rank ``rank`` needs on its host."""
        return {}

    def netns(self, rank: int) -> str | None:
        """The network namespace of ``rank``'s host (None: this one)."""
        return None

    def service_prefix(self) -> list[str]:
        """Prefix for a service in the middle of the network (the aggregation switch)."""
        return []

    @property
    def service_host(self) -> str:
        return LOOPBACK

    def counters(self) -> list[dict[str, int]] | None:
        """Kernel byte counters of every host's interface, if the hosts have their own."""
        return None
