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

__all__ = ["check_cluster", "bulk_transfer"]

PORT = 5201


def bulk_transfer(cluster: Cluster, src: int, dst: int, seconds: float) -> dict[str, float]:
    """Run one bulk transfer ``src -> dst`` inside the cluster; return the raw measurements."""
    module = [sys.executable, "-m", "dlcomm.emulate.bulk"]
    server = subprocess.Popen([*cluster.prefix(dst), *module, "serve", cluster.address(dst),
                               str(PORT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        sender = subprocess.run([*cluster.prefix(src), *module, "send", cluster.address(dst),
                                 str(PORT), str(seconds)], capture_output=True, text=True,
                                timeout=seconds + 60)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if sender.returncode != 0 or server.returncode != 0:
        raise DlcommError("bulk transfer failed: "
                          f"{(sender.stderr or err).strip().splitlines()[-1:]}")
    return {**json.loads(sender.stdout), **json.loads(out)}


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
