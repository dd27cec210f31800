"""The issue's performance must-shows, in a fresh process each (``-m slow``: timings are
not asserted in the default suite). GPT-3 175B, DP x PP x TP, on fat trees."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json, resource, sys, time
from dlcomm.plan.simulate import SimConfig, simulate
t0 = time.perf_counter()
out = simulate(SimConfig("gpt3-175b", sys.argv[1], int(sys.argv[2]), sys.argv[3]))
wall = time.perf_counter() - t0
print(json.dumps({"simulate_s": out["summary"]["simulate_s"], "wall_s": wall,
                  "iteration_s": out["summary"]["iteration_s"],
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _measure(topology: str, n: int, par: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, topology, str(n), par],
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_gpt3_on_1024_accelerators_in_under_5_s() -> None:
    m = _measure("fattree", 1024, "dp=16,pp=8,tp=8")
    assert m["simulate_s"] < 5.0, m


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["fattree", "hxmesh:a=2", "torus2d"])
def test_gpt3_on_16384_accelerators_in_under_60_s_and_4_gb(topology: str) -> None:
    m = _measure(topology, 16384, "dp=256,pp=8,tp=8")
    assert m["simulate_s"] < 60.0, m
    assert m["peak_rss_bytes"] < 4 * 2**30, m
