"""``dlcomm bench compression``: the throughput part, the summary, the plot, bad options."""

import json

import pytest

from dlcomm.bench.compression import (
    CompressionBench,
    Method,
    parse_methods,
    plot_compression,
    run_compression_bench,
    summarize,
)
from dlcomm.errors import ConfigError
from tests.conftest import run_dlcomm


def test_throughput_part_and_plot(tmp_path):
    cfg = CompressionBench(parts=("throughput",), throughput_methods=("none", "fp16", "topk",
                                                                     "u8bit", "signsgd"),
                           size_bytes=400_000, reps=1)
    result = run_compression_bench(cfg)
    rows = {r["method"]: r for r in result["throughput"]}
    assert rows["none"]["throughput_MBps"] is None  # the identity does no work
    assert rows["fp16"]["compression_ratio"] == pytest.approx(2.0)
    assert rows["topk"]["compression_ratio"] == pytest.approx(50.0, rel=1e-3)
    assert rows["u8bit"]["ring_wire_bytes_per_element"] == pytest.approx(4 / 3, rel=1e-3)
    assert rows["u8bit"]["switch_wire_bytes_per_element"] == pytest.approx(2.0, rel=1e-3)
    assert rows["signsgd"]["switch_wire_bytes_per_element"] is None
    assert result["summary"]["compression_ratio"]["signsgd"] == pytest.approx(32.0)
    out = plot_compression(result, tmp_path / "c.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    json.dumps(result)


def test_summary_of_time_to_target_rows():
    def row(method, rate, bps, ttt, step):
        return {"workload": "digits-cnn", "method": method, "bandwidth": rate,
                "bandwidth_bps": bps, "time_to_target_s": ttt, "time_per_step_s": step}
    rows = [row("none", "100mbit", 1e8, 40.0, 0.2), row("fp16", "100mbit", 1e8, 25.0, 0.12),
            row("topk", "100mbit", 1e8, 10.0, 0.05), row("adaptive", "100mbit", 1e8, None, 0.1),
            row("none", "1gbit", 1e9, 10.0, 0.05), row("adaptive", "1gbit", 1e9, 10.5, 0.052)]
    s = summarize({"train": rows})
    slow = s["time_to_target"]["digits-cnn@100mbit"]
    assert slow["best_method"] == "topk" and slow["best_speedup_over_uncompressed"] == 4.0
    assert slow["speedup_over_fp16"]["topk"] == 2.5
    assert slow["speedup_over_uncompressed"]["adaptive"] is None
    fast = s["adaptive_at_fastest_rate"]["digits-cnn@1gbit"]
    assert fast["time_to_target_over_uncompressed"] == pytest.approx(1.05)


def test_method_specs():
    assert parse_methods("none;topk:ratio=0.01@residual") == [
        Method("none"), Method("topk:ratio=0.01", "residual")]
    assert Method("topk:ratio=0.01", "residual").exchange_spec() == \
        "compressed:method=topk,ratio=0.01,memory=residual"
    assert Method("none").exchange_spec() == "ring"
    with pytest.raises(ConfigError):
        parse_methods("topk@forever")
    with pytest.raises(ConfigError, match="part"):
        CompressionBench(parts=("speed",))
    with pytest.raises(ConfigError, match="target"):
        CompressionBench(workloads=("stdlib-lm",))


def test_cli_rejects_bad_options_in_one_line(tmp_path):
    res = run_dlcomm("bench", "compression", "--parts", "throughput", "--throughput-methods",
                     "topk:ratio=9", "--json", "x.json", tmp=tmp_path)
    assert res.returncode == 2 and "ratio" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists()
