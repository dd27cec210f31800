"""``dlcomm topo``: the commands, their JSON results, errors, and the issue's claims."""

import json
import time

import pytest

from dlcomm.cli import main
from dlcomm.results import validate_result

FIELDS = ("name", "accelerators", "cost", "injection_gbps", "bisection_gbps",
          "alltoall_gbps_per_accel", "allreduce_gbps_per_accel")


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_small_with_workload(tmp_path, capsys):
    j, p = tmp_path / "t.json", tmp_path / "t.png"
    code, out, err = run(capsys, "topo", "compare", "-n", "64", "--radix", "16",
                         "--topologies", "torus2d,hxmesh:a=2,fattree:taper=0.5",
                         "--workload", "bert-large", "--parallelism", "dp=4,pp=4,tp=4",
                         "--json", str(j), "--plot", str(p))
    assert code == 0, err
    doc = json.loads(j.read_text())
    validate_result(doc)
    assert doc["kind"] == "topo-compare" and p.read_bytes()[:4] == b"\x89PNG"
    names = [t["name"] for t in doc["topologies"]]
    assert names[0] == "fat tree non-blocking"         # the baseline is added
    for row in doc["topologies"]:
        assert all(row[k] is not None for k in FIELDS)
        assert row["usd_per_gbps"]["all-reduce"] == pytest.approx(
            row["cost_per_accel"] / row["allreduce_gbps_per_accel"])
        assert row["comm_time_s"] > 0 and {c["dim"] for c in row["comm"]} == {"dp", "tp", "pp"}
    assert doc["topologies"][0]["per_dollar_vs_fattree"]["all-reduce"] == pytest.approx(1.0)
    assert doc["workload"]["name"] == "bert-large"
    assert "Hx2Mesh" in out and "per dollar" in out


def test_show_and_list(tmp_path, capsys):
    j = tmp_path / "s.json"
    code, out, err = run(capsys, "topo", "show", "hxmesh:a=2,b=2,x=4,y=4", "--mincut",
                         "--json", str(j))
    assert code == 0, err
    doc = json.loads(j.read_text())
    validate_result(doc)
    assert doc["kind"] == "topo-show"
    assert doc["topology"]["mincut_gbps"] == doc["topology"]["bandwidth"]["bisection_gbps"]
    assert "board trace links" in out
    code, out, _ = run(capsys, "topo", "list")
    assert code == 0 and "hxmesh" in out and "dragonfly" in out


@pytest.mark.parametrize("args,match", [
    (["topo", "compare", "-n", "64", "--topologies", "mesh9"], "unknown topology"),
    (["topo", "compare", "-n", "64", "--workload", "nope"], "unknown model"),
    (["topo", "compare", "-n", "64", "--parallelism", "dp=4"], "needs --workload"),
    (["topo", "compare", "-n", "64", "--workload", "resnet50", "--parallelism",
      "dp=4096"], "needs 4096 accelerators"),
    (["topo", "compare", "-n", "64", "--link-rate", "fast"], "bad rate"),
    (["topo", "compare", "-n", "1"], ">= 2"),
    (["topo", "show", "torus2d:x=4,y=4,z=3"], "no option(s) ['z']"),
    (["topo", "show", "torus2d:x=4,y=4", "--allreduce-bytes", "lots"], "bad size"),
])
def test_errors_are_one_line(tmp_path, capsys, args, match):
    j = tmp_path / "x.json"
    code, out, err = run(capsys, *args, "--json", str(j))
    assert code != 0
    assert err.startswith("dlcomm: error:") and match in err and err.count("\n") == 1
    assert not j.exists()


def test_unwritable_outputs_fail_before_work(tmp_path, capsys):
    code, _, err = run(capsys, "topo", "compare", "-n", "64", "--plot",
                       str(tmp_path / "no" / "t.png"))
    assert code == 2 and "does not exist" in err


def test_compare_1024_reproduces_the_hammingmesh_argument(tmp_path, capsys):
    """The issue's must-show at ~1k accelerators."""
    j = tmp_path / "t.json"
    code, _, err = run(capsys, "topo", "compare", "--accelerators", "1024", "--json",
                       str(j), "--quiet")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(j.read_text())["topologies"]}
    for name in ("fat tree non-blocking", "fat tree 50% tapered", "fat tree 75% tapered",
                 "dragonfly g=8 a=32", "2D torus 32x32", "2D HyperX 32x32",
                 "Hx2Mesh 16x16", "Hx4Mesh 8x8"):
        assert all(rows[name][k] is not None for k in FIELDS)
    for a, name in ((2, "Hx2Mesh 16x16"), (4, "Hx4Mesh 8x8")):
        row = rows[name]
        assert row["per_dollar_vs_fattree"]["all-reduce"] > 3       # several times
        assert row["switched_port_fraction"] == (a + a) / (2 * a * a)
        assert row["alltoall_bound_gbps_per_accel"] == pytest.approx(1600 / a)
        assert 0.3 / a < row["alltoall_gbps_per_accel"] / 1600 < 1 / a
    assert rows["fat tree non-blocking"]["alltoall_gbps_per_accel"] == pytest.approx(1600)


@pytest.mark.slow
def test_compare_16k_under_a_minute(tmp_path, capsys):
    j = tmp_path / "t.json"
    start = time.perf_counter()
    code, _, err = run(capsys, "topo", "compare", "--accelerators", "16384", "--json",
                       str(j), "--plot", str(tmp_path / "t.png"), "--quiet")
    assert code == 0, err
    assert time.perf_counter() - start < 60
    rows = json.loads(j.read_text())["topologies"]
    assert len(rows) == 9 and all(abs(r["accelerators"] - 16384) < 16 for r in rows)
