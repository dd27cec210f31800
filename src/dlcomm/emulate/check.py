"""``dlcomm cluster check``: does an emulated link carry the rate it was configured for?

Build a temporary cluster, run a bulk TCP transfer from host 0 to host 1, and compare the
rate measured on host 0's interface counter (wire bytes through the shaper) with the
configured rate; the payload goodput at the receiver is reported beside it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from dlcomm.emulate.cluster import Cluster, temporary_cluster
from dlcomm.errors import DlcommError
from dlcomm.results import new_result
from dlcomm.runtime.processes import spawn, stop

__all__ = ["check_cluster", "bulk_transfer", "parallel_bulk", "measure_capacity"]

PORT = 5201


def parallel_bulk(cluster: Cluster, pairs: list[tuple[int, int]], seconds: float
                  ) -> list[dict[str, float]]:
    """Run bulk transfers ``src -> dst`` for every pair at once; the raw measurements."""
    module = [sys.executable, "-m", "dlcomm.emulate.bulk"]
    procs: list[subprocess.Popen[str]] = []
    try:
        servers = [spawn([*cluster.prefix(dst), *module, "serve", cluster.address(dst),
                          str(PORT)], capture=True) for _, dst in pairs]
        procs += servers
        senders = [spawn([*cluster.prefix(src), *module, "send", cluster.address(dst),
                          str(PORT), str(seconds)], capture=True) for src, dst in pairs]
        procs += senders
        results = []
        for sender, server in zip(senders, servers):
            s_out, s_err = sender.communicate(timeout=seconds + 60)
            r_out, r_err = server.communicate(timeout=60)
            if sender.returncode != 0 or server.returncode != 0:
                lines = (s_err or r_err).strip().splitlines()
                raise DlcommError(f"bulk transfer failed: {lines[-1] if lines else 'no output'}")
            results.append({**json.loads(s_out), **json.loads(r_out)})
        return results
    finally:
        stop(procs, grace_s=1.0)


def bulk_transfer(cluster: Cluster, src: int, dst: int, seconds: float) -> dict[str, float]:
    """One bulk transfer ``src -> dst`` inside the cluster; the raw measurements."""
    return parallel_bulk(cluster, [(src, dst)], seconds)[0]


def measure_capacity(streams: int, seconds: float = 1.5) -> dict[str, float]:
    """Aggregate TCP throughput this machine sustains through emulated links.

    ``streams`` disjoint host pairs send at once over links fast enough (100 Gbit/s) not to
    limit; the sum of their goodputs is the machine's capacity for emulated traffic.
    """
    streams = max(1, streams)
    with temporary_cluster(2 * streams, 100e9) as cluster:
        raw = parallel_bulk(cluster, [(2 * i, 2 * i + 1) for i in range(streams)], seconds)
    total = sum(r["payload_bytes"] * 8 / r["seconds"] for r in raw if r["seconds"] > 0)
    return {"streams": streams, "seconds": seconds, "capacity_bps": total}


def check_cluster(hosts: int, rate_bps: float, topology: str = "star",
                  seconds: float = 3.0) -> dict[str, Any]:
    """Measure achieved/configured rate between host 0 and host hosts-1."""
    start = time.perf_counter()
    with temporary_cluster(hosts, rate_bps, topology) as cluster:
        raw = bulk_transfer(cluster, 0, hosts - 1, seconds)
        description = cluster.describe()
    wire_bps = raw["wire_bytes"] * 8 / raw["seconds"]
    goodput_bps = raw["payload_bytes"] * 8 / raw["seconds"] if raw["seconds"] > 0 else 0.0
    result = new_result("cluster-check", {"hosts": hosts, "rate_bps": rate_bps,
                                          "topology": topology, "seconds": seconds})
    result["cluster"] = description
    result["summary"] = {"configured_bps": rate_bps, "achieved_bps": wire_bps,
                         "achieved_ratio": wire_bps / rate_bps, "goodput_bps": goodput_bps,
                         "goodput_ratio": goodput_bps / rate_bps,
                         "wall_time_s": time.perf_counter() - start}
    result["raw"] = raw
    return result
