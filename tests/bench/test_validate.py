"""Calibration fits and the validation's bookkeeping (the emulator itself: make bench)."""

from __future__ import annotations

from typing import Any

import pytest

from dlcomm.bench import validate as validate_mod
from dlcomm.bench.validate import ValidateConfig
from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.calibration import fit, modelled_allreduce_s, star_spec


def test_fit_recovers_overhead_and_efficiency() -> None:
    modelled = [0.032, 0.21, 0.8]
    measured = [0.07 + 1.08 * m for m in modelled]
    a, c = fit(modelled, measured)
    assert a == pytest.approx(0.07) and c == pytest.approx(1.08)
    a, c = fit([1.0, 2.0], [0.9, 2.1])          # would need a negative overhead
    ratios = [1.0 / 0.9, 2.0 / 2.1]             # relative residuals: c = sum(r) / sum(r^2)
    assert a == 0.0 and c == pytest.approx(sum(ratios) / sum(r * r for r in ratios))
    a, c = fit([0.01, 1.0], [0.02, 1.0])        # the small size counts as much as the big
    assert abs(a + c * 0.01 - 0.02) / 0.02 < 1e-9 and abs(a + c - 1.0) < 1e-9


def test_modelled_times_are_the_bandwidth_bounds() -> None:
    assert modelled_allreduce_s("ring", 8, 1e8, 5e8) == pytest.approx(2 * 7 / 8 * 8e8 / 5e8)
    assert modelled_allreduce_s("switch", 8, 1e8, 5e8) == pytest.approx(8e8 / 5e8)
    assert star_spec(4, 1e9) == "fattree:n=4,ports=1,rate=1,ina=1"


def test_validation_compares_unseen_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the emulator and the benchmark replaced by fakes: each case's error is simulated
    over measured, the simulation uses only the calibration's constants."""
    seen: dict[str, Any] = {}

    def fake_calibrate(cfg: Any, say: Any) -> dict[str, Any]:
        seen["calibration"] = cfg
        return {"config": {}, "exchanges": {
            ex: {"overhead_s": 0.01, "efficiency": 1.05, "fit_max_rel_error": 0.0,
                 "points": []} for ex in cfg.exchanges}}

    def fake_emulation(cfg: Any, exchanges: list[str]) -> dict[str, Any]:
        rows = [{"exchange": ex, "iteration_time_s": 0.2 if ex == "ring" else 0.15,
                 "measured_iterations_s": [4.0], "comm_busy_s": 0.1, "exposed_comm_s": 0.05}
                for ex in exchanges]
        return {"summary": {"wall_time_s": 1.0}, "results": rows}

    monkeypatch.setattr(validate_mod, "calibrate", fake_calibrate)
    import dlcomm.emulate.emulation as emulation
    monkeypatch.setattr(emulation, "run_emulation", fake_emulation)
    cfg = ValidateConfig(workloads=("resnet50",), workers=(4,), dilations=(10.0,))
    result = validate_mod.validate(cfg)
    assert seen["calibration"].link_bps == pytest.approx(1e9)
    assert len(result["cases"]) == 2
    for case in result["cases"]:
        assert case["error"] == pytest.approx(case["simulated_s"] / case["measured_s"] - 1)
        assert case["simulated_s"] > case["ideal_s"]          # overhead and efficiency > 1
    assert result["kind"] == "simulate-validate"
    assert result["summary"]["max_abs_error"] == max(abs(c["error"]) for c in result["cases"])


def test_validate_config_checks() -> None:
    with pytest.raises(ConfigError, match="one dilation"):
        ValidateConfig(workers=(4, 8), dilations=(10.0,))
    with pytest.raises(ConfigError, match="ring and switch"):
        ValidateConfig(exchanges=("ring", "sparse-switch"))


def test_stream_calibration_divides_each_stream_by_its_buckets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream mode runs the emulator without a model: buckets of each size handed over at
    once; the time per all-reduce is the stream's time over its buckets."""
    from dlcomm.bench import calibrate as calibrate_mod
    streams: list[Any] = []

    def fake_emulation(cfg: Any, exchanges: list[str]) -> dict[str, Any]:
        streams.append(cfg)
        per_bucket = {ex: 0.002 + (1.1 if ex == "ring" else 1.3) * modelled_allreduce_s(
            ex, cfg.workers, 4 * cfg.stream[0], cfg.bandwidth_bps) for ex in exchanges}
        count = len(cfg.stream)
        return {"results": [{"exchange": ex, "iteration_time_s": t * count,
                             "measured_iterations_s": [t * count] * 2}
                            for ex, t in per_bucket.items()]}

    import dlcomm.emulate.emulation as emulation
    monkeypatch.setattr(emulation, "run_emulation", fake_emulation)
    cfg = calibrate_mod.CalibrationConfig(4, 1e9, sizes=(4_000_000, 26_000_000, 52_000_000))
    result = calibrate_mod.calibrate(cfg)
    assert [len(s.stream) for s in streams] == [25, 4, 2]     # about 100 MB per stream
    assert all(s.stream[0] == size // 4 and s.dilation == 1 for s, size in
               zip(streams, cfg.sizes))
    fits = result["exchanges"]
    assert fits["ring"]["efficiency"] == pytest.approx(1.1, rel=1e-6)
    assert fits["switch"]["efficiency"] == pytest.approx(1.3, rel=1e-6)
    assert fits["switch"]["overhead_s"] == pytest.approx(0.002, rel=1e-4)
    with pytest.raises(ConfigError, match="stream or isolated"):
        calibrate_mod.CalibrationConfig(4, 1e9, mode="both")


def test_a_stream_schedule_has_no_model_and_no_compute() -> None:
    from dlcomm.emulate.dilation import EmulateConfig, schedule_for

    sched = schedule_for(EmulateConfig("stream", 4, 1e9, stream=(1000, 2000)))
    assert sched.bucket_numel == (1000, 2000) and sched.bucket_ready_s == (0.0, 0.0)
    assert sched.timing.iteration_s == 0.0 and sched.gradient_bytes == 12_000
    with pytest.raises(ConfigError):
        EmulateConfig("stream", 4, 1e9, stream=(0,))
    with pytest.raises(ConfigError):
        EmulateConfig("no-such-model", 4, 1e9)
