"""Adaptive compression follows the link: the emulated rate drops in the middle of a run.

A persistent emulated cluster (``dlcomm cluster up``) starts at 10 Gbit/s; while
``dlcomm train --compress adaptive`` runs on it, every link end is re-shaped to 20 Mbit/s
with ``tc qdisc replace``. The policy must keep ``none`` while the link is fast and switch
to a compressed method soon after the rate falls (its per-step record says when).
"""

import json
import os
import subprocess
import time

import pytest

from dlcomm.emulate.plan import ClusterSpec, plan_cluster, tbf_burst_bytes
from tests.conftest import dlcomm_cmd, requires_root, run_dlcomm

SLOW_BPS = 20e6


def reshape(name: str, hosts: int, rate_bps: float) -> None:
    plan = plan_cluster(ClusterSpec(name, hosts, rate_bps))
    for link in plan.links:
        for ns, dev in ((link.a_ns, link.a_if), (link.b_ns, link.b_if)):
            subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                            "rate", f"{int(rate_bps)}bit", "burst",
                            str(tbf_burst_bytes(rate_bps)), "latency", "50ms"], check=True)


@pytest.mark.slow
@requires_root
def test_adaptive_switches_to_compression_when_the_link_slows_down(job_tmp):
    name = f"cx{os.getpid() % 100_000}"
    up = run_dlcomm("cluster", "up", "--name", name, "--hosts", "2", "--bandwidth", "10gbit",
                    tmp=job_tmp)
    assert up.returncode == 0, up.stderr
    try:
        train = subprocess.Popen(
            dlcomm_cmd("train", "--workload", "digits-cnn", "--workers", "2", "--network",
                       "emulated", "--cluster", name, "--compress", "adaptive:every=2,probe=8",
                       "--steps", "600", "--eval-every", "600", "--json", "r.json", "--quiet"),
            cwd=job_tmp, env={**os.environ, "TMPDIR": str(job_tmp)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(14)
        reshape(name, 2, SLOW_BPS)
        _, err = train.communicate(timeout=400)
        assert train.returncode == 0, err[-2000:]
    finally:
        run_dlcomm("cluster", "down", "--name", name, tmp=job_tmp)
    steps = json.loads((job_tmp / "r.json").read_text())["workers"][0]["exchange"][
        "adaptive"]["steps"]
    slow = next((i for i, s in enumerate(steps) if s["bandwidth_Bps"] and i > 3
                 and s["bandwidth_Bps"] < 5 * SLOW_BPS / 8), None)
    assert slow is not None, "the bandwidth estimate never fell"
    fast_steps = [s for s in steps[3:slow] if not s["probe"]]
    assert len(fast_steps) >= 10, f"only {len(fast_steps)} steps ran on the fast link"
    assert all(set(s["methods"].values()) == {"none"} for s in fast_steps)
    later = [s for s in steps[slow:] if not s["probe"]]
    first = next(i for i, s in enumerate(later) if set(s["methods"].values()) != {"none"})
    assert first <= 20, f"compression began {first} steps after the rate fell"
    tail = later[-20:]
    assert all(set(s["methods"].values()) & {"topk", "powersgd", "fp16"} for s in tail)
