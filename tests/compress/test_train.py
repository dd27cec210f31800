"""``dlcomm train --compress SPEC --memory SPEC`` end to end, and the ``compressed`` exchange."""

import json

import pytest

from tests.conftest import run_dlcomm

BASE = ["train", "--workload", "digits-cnn", "--workers", "2", "--quiet"]


def test_train_with_topk_and_residual_memory(job_tmp):
    res = run_dlcomm(*BASE, "--steps", "12", "--compress", "topk:ratio=0.02", "--memory",
                     "residual", "--json", "r.json", tmp=job_tmp)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads((job_tmp / "r.json").read_text())
    s = result["summary"]
    ex = result["workers"][0]["exchange"]
    assert ex["compress"] == "topk:ratio=0.02" and ex["memory"] == "residual"
    assert ex["inner_exchange"] == "ring" and ex["calls"] == 12
    assert ex["traffic_ratio"] > 5
    assert s["bytes_sent_per_worker_per_step"] < s["gradient_bytes"] / 5
    assert all(step["loss"] == step["loss"] for step in result["steps"])  # finite, not NaN


@pytest.mark.slow
def test_train_adaptive_records_its_choice_every_step(job_tmp):
    res = run_dlcomm(*BASE, "--steps", "14", "--compress", "adaptive:every=2,probe=4",
                     "--json", "r.json", tmp=job_tmp)
    assert res.returncode == 0, res.stderr[-2000:]
    ex = json.loads((job_tmp / "r.json").read_text())["workers"][0]["exchange"]
    steps = ex["adaptive"]["steps"]
    assert [s["iteration"] for s in steps] == list(range(13))  # the last one is still open
    assert all(set(s["methods"].values()) <= {"none", "fp16", "powersgd", "topk"}
               for s in steps)
    assert ex["memory"] == "residual" and ex["adaptive"]["decisions"]


@pytest.mark.slow
def test_compressed_exchange_spec_and_bad_specs(job_tmp):
    res = run_dlcomm(*BASE, "--steps", "4", "--exchange", "compressed:method=qsgd,levels=15",
                     "--json", "q.json", tmp=job_tmp)
    assert res.returncode == 0, res.stderr[-2000:]
    ex = json.loads((job_tmp / "q.json").read_text())["workers"][0]["exchange"]
    assert ex["compress"] == "qsgd:levels=15" and ex["traffic_ratio"] > 3
    bad = run_dlcomm(*BASE, "--steps", "4", "--compress", "topk:ratio=5", "--json", "b.json",
                     tmp=job_tmp)
    assert bad.returncode != 0
    assert "ratio" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert not (job_tmp / "b.json").exists()
