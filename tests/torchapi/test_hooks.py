"""dlcomm.torch.hook for every exchange; torch's own hooks and FSDP over the backend."""

import json

import pytest

from tests.conftest import processes_mentioning
from tests.torchapi.helpers import HERE, clean_env, last_json, run_ranks


@pytest.mark.parametrize("spec,compress", [
    ("ring", None), ("switch", None), ("switch", "fp16"),
    pytest.param("sparse-switch", None, marks=pytest.mark.slow),
    pytest.param("auto", None, marks=pytest.mark.slow),
    pytest.param("ring", "fp16", marks=pytest.mark.slow),
])
def test_hook_for_every_exchange_matches_ddp(job_tmp, spec, compress):
    """DDP over gloo with dlcomm.torch.hook(spec): the gradients of plain DDP (within
    the method's bound); a switch exchange with no address gets the job's own switch."""
    args = [spec] + ([compress] if compress else [])
    results = run_ranks(2, HERE / "hooks_worker.py", "dlcomm-hook", *args,
                        env=clean_env(job_tmp))
    for res in results:
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.startswith("ok")
        stats = last_json(res.stdout)
        assert stats["calls"] >= 3  # one bucket per step, 3 steps (more rounds compressed)
        if spec != "ring":
            assert stats["counting"] == "measured" and stats["bytes_sent"] > 0
    assert not [p for p in processes_mentioning("switch serve")
                if str(job_tmp) in " ".join(p.cmdline())]


def test_torchs_own_hooks_over_the_dlcomm_backend(job_tmp):
    results = run_ranks(2, HERE / "hooks_worker.py", "torch-hooks", env=clean_env(job_tmp))
    for res in results:
        assert res.returncode == 0, res.stderr[-3000:]
        assert "fp16 ok" in res.stdout and "powersgd ok" in res.stdout
        stats = last_json(res.stdout)
        assert stats["routes"]["exchange"] > 0  # PowerSGD's factors and fp16 buckets


def test_fsdp_reaches_gloos_loss(job_tmp):
    losses = {}
    for backend in ("gloo", "dlcomm"):
        results = run_ranks(2, HERE / "fsdp_worker.py", backend, env=clean_env(job_tmp))
        for res in results:
            assert res.returncode == 0, res.stderr[-3000:]
        losses[backend] = json.loads(results[0].stdout.splitlines()[-1])["losses"]
    assert losses["dlcomm"][-1] < 0.8 * losses["dlcomm"][0]  # it learns
    for ours, ref in zip(losses["dlcomm"], losses["gloo"]):
        assert abs(ours - ref) <= 1e-5 * abs(ref)
