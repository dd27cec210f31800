"""`dlcomm advise` end to end: a user's own model, a trainable workload, bad --model."""

import json
import os

import pytest

from dlcomm.advise.run import machine_factor
from dlcomm.results import validate_result
from tests.conftest import REPO, run_dlcomm, run_dlcomm_here


def advise(tmp, *args, here: bool = False):
    """``dlcomm advise ARGS`` as the real command or, with ``here``, in this process
    (bad input that ends before any work: see run_dlcomm_here)."""
    if here:
        return run_dlcomm_here("advise", *args, tmp=tmp)
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
    # a user's model is not dlcomm's to train: nothing bounds it by a loopback run
    assert all(c["floor_s"] is None for c in doc["candidates"])
    assert "recommendation:" in res.stdout


BAD_MODELS = [
    ("tests.advise.nope:make", "cannot import tests.advise.nope"),
    ("tests.advise.user_model:not_a_model", "must return (nn.Module, sample batch)"),
    ("tests.advise.user_model:broken", "broken() raised ValueError: no data here"),
    ("tests.advise.user_model", "must be package.module:function"),
]


@pytest.mark.parametrize("target,message", BAD_MODELS)
def test_a_bad_model_is_one_clear_line(job_tmp, target, message):
    # the first case as the real command, the others through its error handling here
    res = advise(job_tmp, "--model", target, "--json", "x.json",
                 here=(target, message) != BAD_MODELS[0])
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


BAD_CONSTANTS = [
    (("--measure", "--calibration", "c.json"), "--measure and --calibration both name"),
    (("--host-speedup", "2", "--verify", "1"), "drop --host-speedup"),
    (("--calibration", "missing.json"), "--calibration: no such file"),
    (("--host-speedup", "0"), "--host-speedup must be positive"),
    (("--compute-ms", "30"), "--compute-ms emulates compute in dlcomm's trainable"),
    (("--compute-ms", "-1"), "--compute-ms must be >= 0"),
    (("--repeats", "0"), "--repeats must be >= 1"),
]


@pytest.mark.parametrize("args,message", BAD_CONSTANTS)
def test_bad_constants_options_are_one_clear_line(job_tmp, args, message):
    res = advise(job_tmp, "--workload", "resnet50", "--methods", "fp16", *args,
                 here=(args, message) != BAD_CONSTANTS[0])
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert message in lines[-1], res.stderr


def test_a_calibration_file_and_named_hosts(job_tmp):
    (job_tmp / "c.json").write_text(json.dumps({"ring_rate_bps": 4e9, "source": "here"}))
    res = advise(job_tmp, "--workload", "resnet50", "--workers", "8", "--bandwidth", "10gbit",
                 "--methods", "fp16", "--calibration", "c.json", "--host-speedup", "4",
                 "--json", "r.json")
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((job_tmp / "r.json").read_text())
    assert doc["config"]["constants"]["ring_rate_bps"] == 4e9
    assert doc["config"]["constants"]["source"] == "here"
    assert doc["config"]["cluster"]["cpu_factor"] == 0.25
    assert doc["config"]["host_speedup"] == 4.0


def test_a_straggler_measures_the_decentralized_protocols(job_tmp):
    res = advise(job_tmp, "--workload", "digits-cnn", "--workers", "2", "--bandwidth", "1gbit",
                 "--straggler", "1:4", "--compute-ms", "5", "--methods", "fp16",
                 "--json", "s.json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "measuring --sync hop" in res.stderr
    # prague's groups are of 4: a 2-worker job is not offered it (its trainer refuses)
    assert "measuring --sync prague" not in res.stderr
    doc = json.loads((job_tmp / "s.json").read_text())
    validate_result(doc)
    assert doc["profile"]["emulated_s"] == 0.005 and doc["config"]["compute_ms"] == 5.0
    cands = {c["candidate"]: c for c in doc["candidates"]}
    assert cands["ring --sync hop"]["iteration_cpu_s"] >= 0.0
    assert "ring --sync prague" not in cands
    assert cands["ring"]["iteration_cpu_s"] is None
    # bsp waits for the straggler's 4 x 5 ms; the others' 5 ms of compute fills 1 x of it
    preds = {p["candidate"]: p for p in doc["predictions"]}
    assert preds["ring"]["compute_s"] > 0.015


@pytest.mark.skipif(machine_factor(4) <= 1, reason="4 workers have a core each here")
def test_workers_on_shared_cores_are_bounded_by_a_loopback_run(job_tmp):
    res = advise(job_tmp, "--workload", "digits-cnn", "--workers", "4", "--bandwidth",
                 "100gbit", "--methods", "fp16", "--only", "ring,switch", "--json", "b.json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "measuring the cores' bound of switch" in res.stderr
    doc = json.loads((job_tmp / "b.json").read_text())
    validate_result(doc)
    floors = {c["candidate"]: c["floor_s"] for c in doc["candidates"]}
    assert set(floors) == {"ring", "switch"} and all(f > 0 for f in floors.values())
    # at 100 Gbit/s the links cost next to nothing: the step on these cores is the bound
    for p in doc["predictions"]:
        assert p["iteration_s"] >= floors[p["candidate"]]
    assert any(p["limiter"] == "cores" and p["terms_s"]["cores"] == p["iteration_s"]
               for p in doc["predictions"])


@pytest.mark.skipif(machine_factor(4) <= 1, reason="4 workers have a core each here")
def test_no_core_bound_leaves_the_model_unbounded(job_tmp):
    res = advise(job_tmp, "--workload", "digits-cnn", "--workers", "4", "--bandwidth",
                 "100gbit", "--methods", "fp16", "--only", "ring", "--no-core-bound",
                 "--json", "n.json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "cores' bound" not in res.stderr
    doc = json.loads((job_tmp / "n.json").read_text())
    validate_result(doc)
    assert doc["candidates"] and all(c["floor_s"] is None for c in doc["candidates"])
    assert all(p["limiter"] != "cores" and "cores" not in p["terms_s"]
               for p in doc["predictions"])


@pytest.mark.slow
def test_measure_fits_this_machine(job_tmp):
    res = advise(job_tmp, "--workload", "resnet50", "--workers", "2", "--bandwidth", "1gbit",
                 "--methods", "fp16", "--measure", "--json", "m.json")
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((job_tmp / "m.json").read_text())
    k, cal = doc["config"]["constants"], doc["calibration"]
    assert k["source"] == "measured" and cal["workers_measured"] == 2
    assert {"ring", "switch", "sparse-switch"} <= set(cal["fits"])
    assert k["ring_rate_bps"] > 1e8 and k["switch_rate_bps"] > 1e8
    assert 0 < k["ring_alpha_s"] < 0.05
    if os.geteuid() == 0:   # the emulated star: the capacity that sets K, the links
        assert k["emulation_capacity_bps"] != 30e9
    # the file it wrote is a calibration for the next run
    again = advise(job_tmp, "--workload", "resnet50", "--workers", "2", "--bandwidth",
                   "1gbit", "--methods", "fp16", "--calibration", "m.json", "--json", "n.json")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((job_tmp / "n.json").read_text())["config"]["constants"] == k


def test_verification_emulates_the_jobs_compute_as_the_model_prices_it():
    from dlcomm.advise.main import _train_args

    args = _train_args("digits-cnn", 8, "1gbit", 16, 30.0)
    assert args[:4] == ["--workload", "digits-cnn", "--workers", "8"]
    assert args[args.index("--compute-ms") + 1] == "30"
    assert args[args.index("--batch-size") + 1] == "16"
    assert "--compute-ms" not in _train_args("digits-cnn", 8, "1gbit", None, 0.0)
    # the cores' bound runs the same job on loopback
    assert "--network" not in _train_args("digits-cnn", 8, None, 16, 30.0)
