"""`dlcomm bench allreduce` on loopback: exact results, reproducible checksums, JSON shape."""

import json

import pytest
import torch

from dlcomm.bench.allreduce import AllreduceBench, make_input, reference_sum
from dlcomm.errors import ConfigError, RegistryError
from dlcomm.exchange.bounds import LinkFacts, bandwidth_bound_s
from dlcomm.registry import split_specs
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


def test_sparse_and_auto_equal_dense_switch_over_sockets(job_tmp):
    """Threshold 0: the three switch modes give the same bytes, with fewer sent when sparse,
    also with loss injected on the switch and the workers."""
    res = run_dlcomm("bench", "allreduce", "--exchange", "switch,sparse-switch,auto",
                     "--workers", "3", "--size", "8MB", "--reps", "2", "--density", "0.05",
                     "--pattern", "independent", "--json", "s.json", tmp=job_tmp, timeout=240)
    assert res.returncode == 0, res.stderr
    rows = {r["exchange"]: r for r in json.loads((job_tmp / "s.json").read_text())["results"]}
    assert len({r["checksum"] for r in rows.values()}) == 1
    sent = {name: r["exchange_stats"][0]["bytes_sent"] for name, r in rows.items()}
    assert sent["sparse-switch"] < 0.3 * sent["switch"]
    assert rows["auto"]["exchange_stats"][0]["sparse_ops"] > 0
    lossy = run_dlcomm("bench", "allreduce", "--exchange", "sparse-switch", "--workers", "3",
                       "--size", "8MB", "--reps", "2", "--density", "0.05", "--pattern",
                       "independent", "--drop-rate", "0.02", "--json", "l.json", tmp=job_tmp,
                       timeout=240)
    assert lossy.returncode == 0, lossy.stderr
    row = json.loads((job_tmp / "l.json").read_text())["results"][0]
    assert row["checksum"] == rows["switch"]["checksum"]


@pytest.mark.parametrize("pattern", ["shared", "independent", "elementwise"])
def test_input_density(pattern):
    x = make_input(1, 0, 256 * 400, 0.1, pattern, 256)
    nonzero_blocks = (x.view(-1, 256) != 0).any(dim=1).float().mean().item()
    nonzero = (x != 0).float().mean().item()
    if pattern == "elementwise":
        assert 0.08 < nonzero < 0.12 and nonzero_blocks > 0.99
    else:
        assert 0.05 < nonzero_blocks < 0.15
    assert not torch.signbit(x[x == 0]).any()  # zeros are +0.0


def test_compressed_exchange_over_a_switch_gets_one(job_tmp):
    """`compressed:...,over=switch` needs a switch like `switch` does: the launcher starts
    one and hands its address to the inner exchange, whose bytes are then measured."""
    res = run_dlcomm("bench", "allreduce", "--exchange", "compressed:method=fp16,over=switch",
                     "--workers", "2", "--size", "1MB", "--reps", "1", "--json", "c.json",
                     tmp=job_tmp, timeout=120)
    assert res.returncode == 0, res.stderr
    row = json.loads((job_tmp / "c.json").read_text())["results"][0]
    assert row["max_abs_error"] < 1e-2
    assert row["exchange_stats"][0]["bytes_sent"] > 0


@pytest.mark.parametrize("interleave", [False, True])
def test_repetitions_are_measured_past_an_exchanges_different_start(job_tmp, interleave):
    """PowerSGD all-reduces its first ``start`` iterations uncompressed: a benchmark that
    counted them would time the plain ring under PowerSGD's name. The warm-up grows by
    them (for every exchange alike when they take turns), so each measured repetition is
    a compressed one."""
    res = run_dlcomm("bench", "allreduce", "--exchange",
                     "ring,compressed:method=powersgd:rank=2,start=3,over=ring", "--workers",
                     "2", "--size", "1MB", "--reps", "2", "--warmup", "0",
                     *(["--interleave"] if interleave else []), "--json", "w.json",
                     tmp=job_tmp, timeout=120)
    assert res.returncode == 0, res.stderr
    ring, powersgd = json.loads((job_tmp / "w.json").read_text())["results"]
    assert powersgd["exchange_stats"][0]["calls"] == 3 + 2
    assert ring["exchange_stats"][0]["calls"] == (3 + 2 if interleave else 2)
    assert len(powersgd["times_s"]) == len(ring["times_s"]) == 2


def test_a_compressors_options_may_follow_its_name_either_way():
    """``method=powersgd:rank=2,start=5`` once failed: the later option was glued to the
    name's own (``rank='2:start=5'``). Both spellings now build the same compressor."""
    from dlcomm.exchange import ExchangeContext, make_exchange

    for spec in ("compressed:method=powersgd:rank=2,start=5,over=ring",
                 "compressed:method=powersgd,rank=2,start=5,over=ring"):
        exchange = make_exchange(spec, ExchangeContext(0, 1))
        try:
            assert exchange.spec["compress"] == "powersgd:rank=2,start=5"
            assert exchange.warmup_iterations == 5
        finally:
            exchange.close()
    with make_exchange("compressed:method=fp16,over=ring", ExchangeContext(0, 1)) as plain:
        assert plain.warmup_iterations == 0
    with make_exchange("ring", ExchangeContext(0, 1)) as ring:
        assert ring.warmup_iterations == 0
