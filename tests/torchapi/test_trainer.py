"""`dlcomm train --backend dlcomm`: DDP with no hook over the c10d backend, the same run."""

import json

import pytest

from dlcomm.bench.backend import step_time
from tests.conftest import run_dlcomm

QUICK = ("--workload", "digits-cnn", "--workers", "2", "--steps", "6", "--quiet",
         "--exchange", "switch")


@pytest.mark.slow  # two trainings (18 s); `make bench` runs `dlcomm bench backend` too
def test_backend_run_equals_hook_run(job_tmp):
    docs = {}
    for backend in ("gloo", "dlcomm"):
        res = run_dlcomm("train", *QUICK, "--backend", backend, "--json", f"{backend}.json",
                         tmp=job_tmp)
        assert res.returncode == 0, res.stderr[-2000:]
        docs[backend] = json.loads((job_tmp / f"{backend}.json").read_text())
    hook, ours = docs["gloo"]["summary"], docs["dlcomm"]["summary"]
    assert ours["bytes_counting"] == "measured"
    # the same gradients through the same switch: the same bytes and the same model
    assert [s["bytes_sent"] for s in docs["dlcomm"]["steps"][:5]] == \
        [s["bytes_sent"] for s in docs["gloo"]["steps"][:5]]
    assert abs(ours["final_loss"] - hook["final_loss"]) <= 1e-4 * abs(hook["final_loss"])


def test_bench_backend_step_time():
    steps = [{"step_time_s": t} for t in (5.0, 1.0, 3.0, 2.0, 4.0)]
    assert step_time(steps, 1) == 2.5 and step_time(steps, 0) == 3.0
    assert step_time(steps[:1], 3) == 5.0  # fewer steps than the warm-up: all of them
