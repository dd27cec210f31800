"""``dlcomm simulate`` through the CLI's own entry point (errors as one line, files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlcomm.cli import main


def run(*args: str) -> int:
    return main(["simulate", *args])


def test_one_simulation_writes_json_and_plot(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    assert run("--workload", "bert-base", "-n", "16", "--topology", "hxmesh:a=2",
               "--parallelism", "pp=2,tp=2", "--json", str(out), "--plot", str(png)) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "simulate" and doc["schema"] == "dlcomm.result/1"
    s = doc["summary"]
    assert s["accelerators"] == 16 and s["iteration_s"] >= s["pipeline_s"] >= s["compute_s"]
    assert doc["resolved"]["parallelism"]["dp"] == 4
    assert len(doc["stages"]) == 2 and doc["collectives"]
    assert png.stat().st_size > 10_000
    assert "pipeline stages" in capsys.readouterr().out


def test_sweep_and_what_if(tmp_path: Path) -> None:
    out, png = tmp_path / "w.json", tmp_path / "w.png"
    assert run("--workload", "resnet50", "--topology", "fattree,torus2d",
               "--exchange", "ring,switch,compressed:method=fp16",
               "--sweep", "accelerators=16,64", "--quiet", "--json", str(out),
               "--plot", str(png)) == 0
    doc = json.loads(out.read_text())
    assert len(doc["runs"]) == 12
    torus_switch = [r for r in doc["runs"] if r["topology"] == "torus2d"
                    and r["exchange"] == "switch"]
    assert all(not r["available"] for r in torus_switch)
    ft = next(c for c in doc["comparisons"]
              if c["topology"] == "fattree" and c["accelerators_requested"] == 64)
    assert ft["baseline"] == "ring" and ft["speedup"]["switch"] >= 1.0
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["--workload", "resnet50", "--exchange", "switch", "--topology", "torus2d", "-n", "16"],
     "ina=1"),
    (["--workload", "nope"], "unknown model"),
    (["--workload", "resnet50", "--sweep", "nodes=4"], "--sweep"),
    (["-n", "8"], "--workload is required"),
])
def test_bad_input_is_one_line_and_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           args: list[str], message: str) -> None:
    out = tmp_path / "bad.json"
    assert run(*args, "--json", str(out)) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("dlcomm: error:") and message in err and "\n" not in err
    assert not out.exists()


def test_packet_command(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    assert run("packet", "--workers", "4", "--size", "1MB", "--json", str(out)) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "simulate-packet"
    assert abs(doc["summary"]["packet_model_error"]) < 0.02


def test_calibration_file_is_applied(tmp_path: Path) -> None:
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"exchanges": {"ring": {"overhead_s": 0.5, "efficiency": 1.0}}}))
    out = tmp_path / "c.json"
    base = ["--workload", "resnet50", "--topology", "fattree:n=4,ports=1,rate=1",
            "--parallelism", "dp=4,bytes=4", "--quiet"]
    assert run(*base, "--json", str(out)) == 0
    plain = json.loads(out.read_text())["summary"]["iteration_s"]
    assert run(*base, "--calibration", str(cal), "--json", str(out)) == 0
    slowed = json.loads(out.read_text())["summary"]["iteration_s"]
    assert slowed > plain + 0.5 * 2          # resnet50 has several buckets, each +0.5 s
    cal.write_text("{}")
    assert run(*base, "--calibration", str(cal)) != 0
