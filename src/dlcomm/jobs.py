"""Run a job's workers where its network options place them (composition of train + emulate).

``run_workers`` picks the rendezvous port (checked free on loopback; any port inside a fresh
emulated cluster) and starts the ranks through the local launcher with the placement's
command prefix (``ip netns exec HOST``) and environment.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from dlcomm.emulate.placement import NetworkOptions, Placement, placement
from dlcomm.runtime.launcher import check_port_free, free_port, launch

__all__ = ["run_workers", "placement", "NetworkOptions", "Placement"]


def run_workers(config: dict[str, Any], workers: int, place: Placement, *,
                master_port: int = 0, entry: Sequence[str] = ("worker",),
                rank0_output: bool = True) -> None:
    """Start ``workers`` ranks of ``dlcomm ENTRY`` with ``config`` and wait for them."""
    if place.cluster is None:
        if master_port:
            check_port_free(place.master_addr, master_port)
        else:
            master_port = free_port(place.master_addr)
    elif not master_port:
        master_port = random.randint(20000, 59999)
    launch(config, workers, place.master_addr, master_port, entry=entry,
           command_prefix=place.prefix, extra_env=place.env, rank0_output=rank0_output)
