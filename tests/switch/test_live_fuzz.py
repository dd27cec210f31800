"""A short fuzz campaign against a live switch on loopback while an honest job all-reduces
(``dlcomm bench fuzz``; ``make bench`` runs the full one: 1,000,000 datagrams and 100,000
control lines)."""

from __future__ import annotations

from dlcomm.bench.fuzz import FuzzBench, run_fuzz
from tests.conftest import run_dlcomm


def test_a_short_campaign_leaves_the_switch_and_the_honest_job_whole():
    result = run_fuzz(FuzzBench(datagrams=15_000, control_lines=3_000, workers=4,
                                size_bytes=1 << 20, reps=2, seed=3), progress=lambda _: None)
    s = result["summary"]
    assert s["switch_alive"]
    assert s["switch_errors"] == 0, result["switch_counter_deltas"]
    assert s["datagrams_sent"] == 15_000 and s["control_lines_sent"] >= 3_000
    assert s["kernel_drops"] == 0    # the switch saw what was sent
    assert s["honest_runs"] >= 1 and s["honest_runs_failed"] == 0, result["honest"]
    assert s["checksums_identical"], result["honest"]
    assert s["amplification_packets"] <= 1.0 and s["amplification_bytes"] <= 1.0
    assert s["attacker_completions"] > 0      # the deep paths were reached
    assert s["control_replies"] > 0.5 * s["control_lines_sent"]
    deltas = result["switch_counter_deltas"]
    for reason in ("drop_bad_tag", "drop_replay", "drop_bad_source", "drop_out_of_order"):
        assert deltas.get(reason, 0) > 0, reason
    assert s["rss_growth_kib"] < 64 * 1024


def test_bad_options_are_one_line_errors(tmp_path):
    res = run_dlcomm("bench", "fuzz", "--workers", "1", "--json", str(tmp_path / "f.json"),
                     tmp=tmp_path)
    assert res.returncode != 0
    assert res.stderr.strip() == "dlcomm: error: --workers must be >= 2, got 1"
    assert not (tmp_path / "f.json").exists()
