"""`dlcomm advise` end to end: a user's own model, a trainable workload, bad --model."""

import json
import os

import pytest

from dlcomm.results import validate_result
from tests.conftest import REPO, run_dlcomm


def advise(tmp, *args):
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{REPO}:{env_path}" if env_path else str(REPO)
    try:
        return run_dlcomm("advise", *args, tmp=tmp, timeout=300)
    finally:
        if env_path:
            os.environ["PYTHONPATH"] = env_path
        else:
            del os.environ["PYTHONPATH"]


def test_a_users_own_model_end_to_end(job_tmp):
    res = advise(job_tmp, "--model", "tests.advise.user_model:make", "--workers", "4",
                 "--bandwidth", "1gbit", "--methods", "fp16", "--json", "a.json",
                 "--plot", "a.png")
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((job_tmp / "a.json").read_text())
    validate_result(doc)
    assert doc["kind"] == "advise" and doc["profile"]["source"] == "measured"
    # 64*256+256 + 256*256+256 + 256*10+10 parameters, float32, in DDP's buckets
    assert doc["profile"]["gradient_bytes"] == 4 * (16640 + 65792 + 2570)
    labels = [p["candidate"] for p in doc["predictions"]]
    assert {"ring", "switch", "sparse-switch", "auto"} <= set(labels)
    assert doc["summary"]["recommendation"] == labels[0]
    assert (job_tmp / "a.png").read_bytes()[:4] == b"\x89PNG"
    assert "recommendation:" in res.stdout


@pytest.mark.parametrize("target,message", [
    ("tests.advise.nope:make", "cannot import tests.advise.nope"),
    ("tests.advise.user_model:not_a_model", "must return (nn.Module, sample batch)"),
    ("tests.advise.user_model:broken", "broken() raised ValueError: no data here"),
    ("tests.advise.user_model", "must be package.module:function"),
])
def test_a_bad_model_is_one_clear_line(job_tmp, target, message):
    res = advise(job_tmp, "--model", target, "--json", "x.json")
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert message in lines[-1] and len(lines) <= 2, res.stderr
    assert not (job_tmp / "x.json").exists()


def test_a_catalog_model_is_profiled_from_the_catalog(job_tmp):
    res = advise(job_tmp, "--workload", "resnet50", "--workers", "8", "--bandwidth", "10gbit",
                 "--methods", "fp16", "--json", "r.json")
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((job_tmp / "r.json").read_text())
    assert doc["profile"]["source"] == "catalog" and doc["profile"]["accelerator"] == "v100"
    assert doc["profile"]["gradient_bytes"] > 90e6  # ResNet-50: 25.6M parameters
