"""``dlcomm partition`` end to end: the JSON result, the plot, the table, errors."""

from __future__ import annotations

import json
import tempfile

import pytest

from dlcomm.cli import main
from dlcomm.results import validate_result
from tests.conftest import run_dlcomm


def test_vgg19_on_tpu_v2_and_v3(job_tmp):
    res = run_dlcomm("partition", "--workload", "vgg19", "--devices", "tpu-v2:64,tpu-v3:64",
                     "--batch", "512", "--json", "p.json", "--plot", "p.png", tmp=job_tmp)
    assert res.returncode == 0, res.stderr
    doc = json.loads((job_tmp / "p.json").read_text())
    validate_result(doc)
    assert doc["kind"] == "partition"
    s = doc["summary"]
    speedup = s["speedup_over_dp"]
    assert set(speedup) == {"accpar", "hypar", "owt"}
    assert speedup["accpar"] >= speedup["hypar"] >= speedup["owt"] >= 1
    assert s["levels"] == 7 and s["num_devices"] == 128 and s["partitioned_layers"] == 19
    accpar = doc["schemes"]["accpar"]
    assert accpar["time_s"] == pytest.approx(accpar["compute_s"] + accpar["comm_s"])
    assert [len(level["nodes"]) for level in accpar["levels"]] == [1] + [2] * 6
    top = accpar["levels"][0]["nodes"][0]
    assert top["devices"] == ["tpu-v2 x64", "tpu-v3 x64"]
    assert all(layer["type"] in ("I", "II", "III") and sum(layer["ratio"]) == pytest.approx(1)
               for layer in top["layers"])
    for name in ("dp", "owt", "hypar"):
        entry = doc["schemes"][name]
        assert len(entry["layers"]) == 19 and len(entry["levels"]) == 7
        assert entry["memory"]["fits"]
    assert (job_tmp / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert "AccPar per level" in res.stdout


def test_execute_a_catalog_cnn(job_tmp, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(job_tmp))  # workers' job dir in job_tmp
    out = job_tmp / "x.json"
    assert main(["partition", "--workload", "resnet18", "--devices", "tpu-v2:1,tpu-v3:1",
                 "--batch", "2", "--execute", "--steps", "1", "--json", str(out),
                 "--quiet"]) == 0
    doc = json.loads(out.read_text())
    ex = doc["execution"]
    assert ex["gradients_match"] and ex["bytes_match"] and ex["ranks"] == 2
    assert doc["summary"]["hierarchy"] == "flat"
    for rank in ex["per_rank"]:
        assert rank["bytes_sent"] == rank["model_bytes_sent"] > 0
        assert rank["bytes_received"] == rank["model_bytes_received"]
    assert [r["slowdown"] for r in ex["per_rank"]] == pytest.approx([123 / 45, 1.0])


def test_cluster_file(tmp_path, capsys):
    f = tmp_path / "cluster.toml"
    f.write_text('devices = "npu:2,a100:2"\nbetween_gbps = 100\n'
                 "[accelerators.npu]\npeak_flops = 2e14\nmemory_gb = 48\nscaleup_gbps = 800\n")
    out = tmp_path / "c.json"
    assert main(["partition", "--workload", "alexnet", "--cluster", str(f), "--batch", "64",
                 "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert doc["summary"]["devices"] == "npu:2,a100:2"
    assert doc["config"]["cluster_file"] == str(f)


@pytest.mark.parametrize(("args", "message"), [
    (["--workload", "nope", "--devices", "a100:2"], "unknown model 'nope'"),
    (["--workload", "alexnet", "--devices", "a100:x"], "bad device count"),
    (["--workload", "alexnet", "--devices", "a100:3"], "needs 2^k devices"),
    (["--workload", "alexnet"], "no devices"),
    (["--workload", "alexnet", "--devices", "a100:2", "--batch", "0"], "batch must be >= 1"),
    (["--workload", "alexnet", "--devices", "a100:16", "--execute"], "2 to 8 devices"),
    (["--workload", "alexnet", "--devices", "a100:2", "--execute", "--hierarchy", "binary"],
     "--hierarchy flat"),
    (["--workload", "bert-base", "--devices", "a100:2", "--execute"], "cannot execute"),
    (["--workload", "alexnet", "--devices", "a100:2", "--execute", "--scheme", "best"],
     "unknown partition scheme 'best'"),
])
def test_bad_input_is_one_line(args, message, capsys):
    assert main(["partition", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlcomm: error: ") and message in err and err.count("\n") == 1


def test_unwritable_json_leaves_nothing(tmp_path, capsys):
    target = tmp_path / "missing" / "p.json"
    assert main(["partition", "--workload", "alexnet", "--devices", "a100:2",
                 "--json", str(target)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not target.parent.exists()
