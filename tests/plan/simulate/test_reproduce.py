"""The reproductions run and say what the model allows (full runs: make bench)."""

from __future__ import annotations

import pytest

from dlcomm.plan.simulate.reproduce import reproduce_hammingmesh, reproduce_switchml


def test_switchml_speedups_stay_under_the_byte_advantage() -> None:
    result = reproduce_switchml(workers=(8,), rates_gbps=(10.0, 100.0),
                                models=("vgg19", "resnet50"))
    rows = {(r["model"], r["rate_gbps"]): r for r in result["rows"]}
    for r in rows.values():
        assert 1.0 <= r["speedup"] <= 2 * 7 / 8 + 1e-9    # 2(n-1)/n: ring bytes / switch bytes
    # communication-bound at 10 Gb/s, hidden behind compute at 100 Gb/s
    assert rows[("vgg19", 10.0)]["speedup"] > 1.5
    assert rows[("resnet50", 100.0)]["speedup"] < 1.05


def test_hammingmesh_costs_less_per_iteration_than_a_fat_tree() -> None:
    result = reproduce_hammingmesh(accelerators=64,
                                   topologies=("fattree", "fattree:taper=0.5", "hxmesh:a=2"))
    rows = {r["topology"]: r for r in result["rows"]}
    assert rows["fattree"]["resnet50"]["perf_per_dollar_vs_fattree"] == pytest.approx(1.0)
    hx = rows["hxmesh:a=2"]
    assert hx["cost_per_accel_usd"] < rows["fattree"]["cost_per_accel_usd"]
    assert hx["resnet50"]["perf_per_dollar_vs_fattree"] > 1.0
    assert hx["gpt3-175b"]["iteration_s"] >= rows["fattree"]["gpt3-175b"]["iteration_s"] * 0.99
