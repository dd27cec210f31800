"""``dlcomm workloads list`` and ``dlcomm workloads show``."""

import json

import pytest

from dlcomm.cli import main
from dlcomm.results import validate_result
from dlcomm.workloads.catalog import get_model
from tests.conftest import run_dlcomm


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_both_tables(capsys):
    code, out, _ = run(capsys, "workloads", "list")
    assert code == 0
    assert "digits-cnn" in out and "big-model layer tables" in out
    for name in ("resnet152", "gpt3-175b", "dlrm", "lstm-lm", "bert-large"):
        assert name in out
    assert "174,604,259,328" in out


def test_show_writes_workload_json(capsys, tmp_path):
    path = tmp_path / "r50.json"
    code, out, _ = run(capsys, "workloads", "show", "resnet50", "--accelerator", "v100",
                       "--batch", "128", "--json", str(path))
    assert code == 0 and "layer1.[1-2].conv2" in out and "totals" in out
    doc = json.loads(path.read_text())
    validate_result(doc)
    model = get_model("resnet50")
    assert doc["kind"] == "workload" and doc["config"]["accelerator"] == "v100"
    s = doc["summary"]
    assert s["params"] == model.params and s["batch"] == 128 and s["layers"] == 109
    assert s["iteration_s"] == pytest.approx(3 * model.flops_per_sample * 128 / 50e12)
    assert len(doc["layers"]) == 109 and doc["layers"][0]["name"] == "conv1"
    assert doc["layers"][0]["forward_s"] > 0
    assert sum(b["bytes"] for b in doc["buckets"]) == s["gradient_bytes"]


def test_show_groups_blocks_unless_all(capsys):
    code, out, _ = run(capsys, "workloads", "show", "gpt3-175b", "--accelerator", "h100")
    assert code == 0 and "h.[0-95].mlp.fc" in out and "h.95.mlp.fc" not in out
    code, out, _ = run(capsys, "workloads", "show", "gpt2-1.5b", "--all")
    assert code == 0 and "h.47.mlp.proj" in out and "[0-47]" not in out


def test_show_measured_time_and_custom_accelerator(capsys, tmp_path):
    accs = tmp_path / "acc.toml"
    accs.write_text("[accelerators.my-npu]\npeak_flops = 2.0e14\nmemory_gb = 48\n")
    path = tmp_path / "w.json"
    code, _, err = run(capsys, "workloads", "show", "lstm-lm", "--accelerator", "my-npu",
                       "--accelerator-file", str(accs), "--measured-s", "0.02",
                       "--efficiency", "0.5", "--json", str(path))
    assert code == 0, err
    s = json.loads(path.read_text())["summary"]
    assert s["accelerator"] == "my-npu" and s["efficiency"] == 0.5
    assert s["iteration_s"] == pytest.approx(0.02)
    code, _, err = run(capsys, "workloads", "show", "lstm-lm", "--accelerator", "npu2",
                       "--accelerator-file", str(accs))
    assert code == 2 and "my-npu" in err and "v100" in err


@pytest.mark.parametrize("args,message", [
    (["resnet51"], "unknown model 'resnet51' (known: alexnet"),
    (["resnet50", "--accelerator", "tpu9"], "unknown accelerator 'tpu9' (known: a100"),
    (["resnet50", "--batch", "0"], "batch must be at least 1"),
    (["resnet50", "--efficiency", "1.5"], "efficiency must be in (0, 1]"),
    (["resnet50", "--bucket-mb", "0"], "--bucket-mb must be positive"),
    (["resnet50", "--json", "/nonexistent-dir/x.json"], "does not exist"),
])
def test_show_bad_input_is_one_line(capsys, args, message):
    code, out, err = run(capsys, "workloads", "show", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dlcomm: error: ") and message in err


def test_show_bad_name_subprocess(tmp_path):
    proc = run_dlcomm("workloads", "show", "imagenet-9000", tmp=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("dlcomm: error: unknown model 'imagenet-9000'")
    assert list(tmp_path.iterdir()) == []
