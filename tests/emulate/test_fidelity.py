"""The emulator's numbers are trustworthy: ring meets its bandwidth bound, and the
emulated iteration time does not depend on the dilation factor (root only)."""

import json

import pytest

from tests.conftest import requires_root, run_dlcomm

# Link rates at which this 2-core machine's CPU does not limit the ring (see docs/emulation.md).
RATES = {2: "1gbit", 4: "1gbit", 8: "500mbit"}


@requires_root
@pytest.mark.parametrize("workers", [2, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_ring_allreduce_within_15_percent_of_bound(job_tmp, workers):
    res = run_dlcomm("bench", "allreduce", "--exchange", "ring", "--workers", str(workers),
                     "--size", "10MB", "--reps", "4", "--network", "emulated", "--bandwidth",
                     RATES[workers], "--json", "b.json", tmp=job_tmp, timeout=240)
    assert res.returncode == 0, res.stderr
    row = json.loads((job_tmp / "b.json").read_text())["results"][0]
    # the best repetition: what the emulated links can do (a busy machine only slows others);
    # a full token bucket lets its burst through at memory speed, so a run may beat the
    # bound by a few percent
    assert 0.95 <= min(row["times_s"]) / row["bound_s"] <= 1.15, row["times_s"]
    wire = row["wire_bytes_per_host"]
    expected = 2 * (workers - 1) / workers * 10e6
    assert all(expected <= w["tx_bytes"] <= 1.1 * expected for w in wire), wire


@requires_root
@pytest.mark.slow  # a measurement (36 s); `dlcomm bench fidelity` reports it in make bench
def test_iteration_time_independent_of_dilation(job_tmp):
    times = {}
    for k in (5, 10):
        res = run_dlcomm("emulate", "--workload", "resnet50", "--workers", "4", "--bandwidth",
                         "5gbit", "--dilation", str(k), "--iterations", "2", "--json",
                         f"e{k}.json", tmp=job_tmp, timeout=300)
        assert res.returncode == 0, res.stderr
        times[k] = json.loads((job_tmp / f"e{k}.json").read_text())["summary"]["iteration_time_s"]
    assert abs(times[5] - times[10]) / times[10] <= 0.10, times
