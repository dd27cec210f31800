"""The dlcomm c10d backend in real torch programs: torchrun, DDP, every collective, the
switch's lifecycle and a bad configuration (docs/torch.md)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from dlcomm.switch.service import running_switches
from tests.conftest import UnusedPort, assert_no_leftovers, processes_mentioning
from tests.torchapi.helpers import (
    GRADIENT_BYTES,
    HERE,
    TUTORIAL,
    clean_env,
    last_json,
    run_ranks,
    torchrun,
)

# the switch adds 32-bit fixed point after an agreed exponent: each sum is within
# n * 2^(e + L - 31) of gloo's, ~1e-8 of the chunk's largest value; 20 SGD steps keep the
# weights within 1e-6 of the gloo run's (they move by ~0.1)
WEIGHT_ATOL = 1e-6


def switch_env(service, tmp, **extra):
    return clean_env(tmp, DLCOMM_SWITCH=service.spec_addr,
                     DLCOMM_SWITCH_FP=service.fingerprints[0], **extra)


def assert_weights_close(ours_path, gloo_path):
    ours, ref = torch.load(ours_path), torch.load(gloo_path)
    moved = 0.0
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=0, atol=WEIGHT_ATOL, msg=name)
        moved = max(moved, float((ref[name]).abs().max()))
    assert moved > 100 * WEIGHT_ATOL


def test_ddp_tutorial_torchrun_through_a_running_switch(job_tmp, gloo_weights):
    """The tutorial, 4 ranks under torchrun, joining a running switch: its counters show
    every gradient step went through it; the weights equal gloo's within the bound."""
    with running_switches("127.0.0.1", 1) as service:
        res = torchrun(job_tmp, 4, TUTORIAL, "dlcomm", "dlcomm.pt",
                       env=switch_env(service, job_tmp))
        assert res.returncode == 0, res.stderr[-3000:]
    counters = service.final_stats[0]["counters"]
    # the gradients of every step (one 16 KB bucket), from each of the 4 ranks
    assert counters["completions"] >= 20 and counters["bytes_in"] >= 20 * 4 * GRADIENT_BYTES
    assert counters["control_registrations"] == 1 and counters["control_jobs_left"] == 1
    assert_weights_close(job_tmp / "dlcomm.pt", gloo_weights(4))


@pytest.mark.parametrize("exchange,atol", [
    pytest.param("sparse-switch", WEIGHT_ATOL, marks=pytest.mark.slow),
    ("compressed:method=fp16,over=switch", 1e-3),  # fp16's rounding, 20 steps
    pytest.param("auto", WEIGHT_ATOL, marks=pytest.mark.slow),
    pytest.param("compressed:method=powersgd:rank=2,memory=powersgd,over=switch", None,
                 marks=pytest.mark.slow),
])
def test_every_exchange_through_the_backend(job_tmp, gloo_weights, exchange, atol):
    stats = job_tmp / "switch.json"
    env = clean_env(job_tmp, DLCOMM_EXCHANGE=exchange, DLCOMM_SWITCH_STATS=str(stats))
    res = torchrun(job_tmp, 2, TUTORIAL, "dlcomm", "ours.pt", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(stats.read_text())["counters"]["completions"] >= 20
    if atol is None:  # low-rank: it trains, the weights differ
        return
    ours, ref = torch.load(job_tmp / "ours.pt"), torch.load(gloo_weights(2))
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=0, atol=atol, msg=name)


def test_a_job_with_no_switch_gets_its_own_and_it_goes_with_the_job(job_tmp):
    stats = job_tmp / "switch.json"
    env = clean_env(job_tmp, DLCOMM_SWITCH_STATS=str(stats))
    res = torchrun(job_tmp, 2, TUTORIAL, "cpu:dlcomm", "own.pt", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "the job's switch listens on 127.0.0.1:" in res.stderr
    counters = json.loads(stats.read_text())["counters"]
    assert counters["completions"] >= 20 and counters["control_jobs_left"] == 1
    assert not [p for p in processes_mentioning("switch serve") if str(job_tmp) in
                " ".join(p.cmdline())]


def test_every_collective_gives_gloo_results(job_tmp):
    """Every collective, dtype and reduce op, sync and async, and a subgroup, against the
    same calls on a gloo group (collectives_worker.py); large float sums went through the
    job's own switch."""
    results = run_ranks(4, HERE / "collectives_worker.py", env=clean_env(job_tmp))
    for res in results:
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.startswith("ok ")
        stats = last_json(res.stdout)
        # float32/16/bf16 x SUM/AVG x sync/async over the threshold, and two shapes
        assert stats["routes"]["exchange"] == 14 and stats["exchange"]["dense_ops"] == 14
        assert stats["routes"]["small"] > 0 and stats["routes"]["dtype"] > 0


@pytest.mark.parametrize("env,message", [
    ({"DLCOMM_EXCHANGE": "swich"}, "DLCOMM_EXCHANGE: unknown exchange 'swich'"),
    # the rest of the pure checks run in test_config.py; these once more end to end
    pytest.param({"DLCOMM_EXCHANGE": "switch:windw=4"}, "has no option", marks=pytest.mark.slow),
    pytest.param({"DLCOMM_MIN_BYTES": "many"}, "DLCOMM_MIN_BYTES must be a whole number",
                 marks=pytest.mark.slow),
])
def test_bad_configuration_fails_init_with_one_line(job_tmp, env, message):
    start = time.monotonic()
    res = torchrun(job_tmp, 2, TUTORIAL, "dlcomm", "x.pt", env=clean_env(job_tmp, **env))
    assert res.returncode != 0
    assert message in res.stderr, res.stderr[-2000:]
    assert time.monotonic() - start < 60
    assert not (job_tmp / "x.pt").exists()


def test_unreachable_switch_fails_init_on_every_rank(job_tmp):
    with UnusedPort() as port:
        env = clean_env(job_tmp, DLCOMM_SWITCH=f"127.0.0.1:{port.port}",
                        DLCOMM_SWITCH_FP="ab" * 32)
        start = time.monotonic()
        res = torchrun(job_tmp, 2, TUTORIAL, "dlcomm", "x.pt", env=env)
    assert res.returncode != 0
    assert "cannot reach" in res.stderr or "refused" in res.stderr, res.stderr[-2000:]
    assert time.monotonic() - start < 60


def test_wrong_certificate_fingerprint_fails_init(job_tmp):
    with running_switches("127.0.0.1", 1) as service:
        env = clean_env(job_tmp, DLCOMM_SWITCH=service.spec_addr, DLCOMM_SWITCH_FP="ab" * 32)
        res = torchrun(job_tmp, 2, TUTORIAL, "dlcomm", "x.pt", env=env)
    assert res.returncode != 0
    assert "fingerprint" in res.stderr or "certificate" in res.stderr, res.stderr[-2000:]
    assert service.final_stats[0]["counters"].get("control_registrations", 0) == 0


def test_a_switch_rank_0_cannot_start_fails_every_rank_at_init(job_tmp):
    """Rank 0 cannot bind the job's switch (an address this host does not have: nothing is
    sent there); every rank fails init with rank 0's reason, at once."""
    start = time.monotonic()
    env = clean_env(job_tmp, DLCOMM_SWITCH_BIND="192.0.2.1")
    res = torchrun(job_tmp, 2, TUTORIAL, "dlcomm", "x.pt", env=env)
    assert res.returncode != 0
    assert "did not start" in res.stderr, res.stderr[-2000:]
    assert time.monotonic() - start < 60


def test_wrong_admin_token_fails_init(job_tmp):
    token = job_tmp / "switch.token"
    with running_switches("127.0.0.1", 1, extra_args=("--token-file", str(token))) as service:
        wrong = job_tmp / "wrong.token"
        wrong.write_text("not-the-token-of-this-switch\n")
        env = switch_env(service, job_tmp, DLCOMM_SWITCH_TOKEN_FILE=str(wrong))
        res = torchrun(job_tmp, 2, TUTORIAL, "dlcomm", "x.pt", env=env)
    assert res.returncode != 0
    assert "token" in res.stderr, res.stderr[-2000:]
    assert service.final_stats[0]["counters"].get("control_registrations", 0) == 0


def test_a_dead_peer_fails_the_others_with_dlcomms_reason(job_tmp):
    start = time.monotonic()
    results = run_ranks(3, HERE / "loop_worker.py", "200", "1", "5", env=clean_env(job_tmp),
                        timeout=90)
    assert results[1].returncode == 1
    for res in (results[0], results[2]):
        assert res.returncode == 3, res.stderr[-2000:]
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("failed")][0]
        assert "DistBackendError: dlcomm:" in line and "rank 1" in line, line
    assert time.monotonic() - start < 60  # well within the group's 20 s timeout + start-up


@pytest.mark.parametrize("sig", [signal.SIGTERM,
                                 pytest.param(signal.SIGKILL, marks=pytest.mark.slow)])
def test_a_signalled_job_leaves_the_switch(job_tmp, sig):
    """Ranks killed mid-training: the running switch they joined drops their job."""
    with running_switches("127.0.0.1", 1) as service:
        env = switch_env(service, job_tmp)
        procs = []
        from tests.conftest import Rendezvous
        rdzv = Rendezvous()
        for r in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "loop_worker.py"), "0"],
                env={**env, "RANK": str(r), "WORLD_SIZE": "2", **rdzv.env},
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        for p in procs:
            p.send_signal(sig)
        for p in procs:
            p.wait(timeout=30)
            p.stdout.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            jobs = _switch_jobs(service)
            if not jobs:
                break
            time.sleep(0.2)
        assert jobs == {}, jobs
    assert_no_leftovers(job_tmp)


def _switch_jobs(service) -> dict:
    from dlcomm.switch.client import ControlClient  # noqa: F401 (the CLI below uses it)

    res = subprocess.run([sys.executable, "-m", "dlcomm", "switch", "stats", "--switch",
                          service.spec_addr, "--fingerprint", service.fingerprints[0],
                          "--json"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["jobs"]
