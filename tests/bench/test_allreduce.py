"""`dlcomm bench allreduce` on loopback: exact results, reproducible checksums, JSON shape."""

import json

import pytest
import torch

from dlcomm.bench.allreduce import AllreduceBench, make_input, reference_sum
from dlcomm.errors import ConfigError, RegistryError
from dlcomm.exchange.bounds import LinkFacts, bandwidth_bound_s
from dlcomm.options import split_specs
from tests.conftest import run_dlcomm


def test_bench_json_and_reproducible_checksum(job_tmp):
    docs = []
    for name in ("a.json", "b.json"):
        res = run_dlcomm("bench", "allreduce", "--workers", "3", "--size", "4MB", "--reps", "2",
                         "--seed", "7", "--json", name, tmp=job_tmp)
        assert res.returncode == 0, res.stderr
        docs.append(json.loads((job_tmp / name).read_text()))
    row = docs[0]["results"][0]
    assert row["exchange"] == "ring" and row["time_s"] > 0 and row["bound_s"] is None
    assert row["max_abs_error"] < 1e-5 and row["finite"]
    assert row["checksum"] == docs[1]["results"][0]["checksum"]
    assert len(row["times_s"]) == 2


def test_reference_sum_is_the_sum_of_inputs():
    ref = reference_sum(3, 4, 1000)
    assert torch.allclose(ref, sum(make_input(3, r, 1000).double() for r in range(4)))
    assert not torch.equal(make_input(3, 0, 10), make_input(3, 1, 10))


@pytest.mark.parametrize("kwargs,error", [
    (dict(exchanges=()), ConfigError), (dict(exchanges=("pigeon",)), RegistryError),
    (dict(size_bytes=6), ConfigError), (dict(reps=0), ConfigError)])
def test_bad_bench_config(kwargs, error):
    with pytest.raises(error):
        AllreduceBench(**{**dict(exchanges=("ring",), workers=2, size_bytes=400), **kwargs})


def test_bounds():
    star = LinkFacts(1e9)
    assert bandwidth_bound_s("ring", 4, 100e6, star) == pytest.approx(1.2)
    assert bandwidth_bound_s("switch:k=256", 4, 100e6, star) == pytest.approx(0.8)
    assert bandwidth_bound_s("ring", 1, 100e6, star) == 0
    racked = LinkFacts(1e9, per_rack=2, uplink_bps=1e9)  # 2:1 oversubscribed uplinks
    assert bandwidth_bound_s("ring", 4, 100e6, racked) == pytest.approx(1.2)
    assert bandwidth_bound_s("switch", 4, 100e6, racked) == pytest.approx(1.6)


def test_split_specs():
    assert split_specs("ring,switch:k=256,window=64,sparse-switch") == [
        "ring", "switch:k=256,window=64", "sparse-switch"]
    assert split_specs(" ring , ") == ["ring"]
