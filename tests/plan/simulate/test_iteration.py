"""Whole iterations: the emulator's model, the planner's traffic, exchanges, errors."""

from __future__ import annotations

import pytest

from dlcomm.emulate.dilation import EmulateConfig, schedule_for
from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.iteration import SimConfig, simulate
from dlcomm.plan.traffic import Parallelism, iteration_traffic
from dlcomm.workloads.catalog import get_model


def star_spec(n: int, gbps: float) -> str:
    return f"fattree:n={n},ports=1,rate={gbps:g},ina=1"


def emulator_closed_form(workload: str, n: int, gbps: float, exchange: str, k: float) -> float:
    """What the emulator does, as arithmetic: compute x K, FIFO buckets at link/K, / K."""
    sched = schedule_for(EmulateConfig(workload, n, gbps * 1e9, dilation=k))
    rate = gbps * 1e9 / 8 / k
    factor = 2 * (n - 1) / n if exchange == "ring" else 1.0
    end = 0.0
    for numel, ready in zip(sched.bucket_numel, sched.bucket_ready_s):
        end = max(end, ready * k) + factor * 4 * numel / rate
    t = sched.timing
    return (t.forward_s * k + max(t.backward_s * k, end)) / k


@pytest.mark.parametrize("exchange", ["ring", "switch"])
@pytest.mark.parametrize("k", [1.0, 20.0])
def test_data_parallel_on_a_star_is_the_emulators_model(exchange: str, k: float) -> None:
    n, gbps = 8, 10.0
    cfg = SimConfig("resnet50", star_spec(n, gbps / k), 0, f"dp={n},bytes=4,micro=1", exchange,
                    algorithm="ring", alpha_us=0, hop_latency_us=0, dilation=k)
    got = simulate(cfg)["summary"]["iteration_s"]
    assert got == pytest.approx(emulator_closed_form("resnet50", n, gbps, exchange, k), rel=1e-6)


def test_time_dilation_keeps_the_real_scale_iteration() -> None:
    base = dict(parallelism="dp=4,bytes=4,micro=1", alpha_us=0, hop_latency_us=0)
    real = simulate(SimConfig("vgg19", star_spec(4, 10), **base))["summary"]
    slow = simulate(SimConfig("vgg19", star_spec(4, 0.5), dilation=20, **base))["summary"]
    assert slow["iteration_s"] == pytest.approx(real["iteration_s"], rel=1e-9)
    assert slow["dilated_iteration_s"] == pytest.approx(20 * real["iteration_s"], rel=1e-9)


def _totals(out: dict, dim: str) -> tuple[int, float]:
    rows = [c for c in out["collectives"] if c["dim"] == dim]
    return (sum(c["calls_per_iteration"] for c in rows),
            sum(c["calls_per_iteration"] * c["nbytes"] for c in rows))


def test_tensor_and_data_parallel_traffic_is_the_planners() -> None:
    par = "dp=2,tp=4"
    out = simulate(SimConfig("gpt2-1.5b", "fattree", 8, par))
    traffic = {c.dim: c for c in iteration_traffic(get_model("gpt2-1.5b"),
                                                   Parallelism(dp=2, tp=4))}
    calls, nbytes = _totals(out, "tp")
    assert calls == traffic["tp"].calls
    assert nbytes == pytest.approx(traffic["tp"].total_bytes, rel=1e-9)
    _, dp_bytes = _totals(out, "dp")
    assert dp_bytes == pytest.approx(traffic["dp"].total_bytes, rel=1e-6)


def test_pipeline_transfers_and_bubble() -> None:
    out = simulate(SimConfig("gpt2-1.5b", "fattree", 16, "dp=2,pp=4,tp=2,micro=8"))
    calls, _ = _totals(out, "pp")
    assert calls == 2 * 8 * 3                     # both ways, every micro-batch, 3 boundaries
    pp = next(c for c in iteration_traffic(get_model("gpt2-1.5b"),
                                           Parallelism(dp=2, pp=4, tp=2, micro=8))
              if c.dim == "pp")
    assert max(c["nbytes"] for c in out["collectives"] if c["dim"] == "pp") == \
        pytest.approx(pp.nbytes)
    s = out["summary"]
    assert s["bubble_fraction"] == pytest.approx(3 / 11)
    assert s["pipeline_s"] >= s["compute_s"] and s["iteration_s"] >= s["pipeline_s"]


def test_exchanges_change_what_dp_moves() -> None:
    base = dict(parallelism="dp=8,bytes=4,micro=1", alpha_us=0, hop_latency_us=0,
                algorithm="ring")
    spec = star_spec(8, 1)

    def dp_alone(**kw: object) -> float:
        out = simulate(SimConfig("resnet50", spec, **{**base, **kw}))
        return sum(c["alone_s"] * c["calls_per_iteration"] for c in out["collectives"]
                   if c["dim"] == "dp")

    ring = dp_alone(exchange="ring")
    assert dp_alone(exchange="switch") == pytest.approx(ring / 1.75, rel=1e-9)
    fp16 = dp_alone(exchange="compressed:method=fp16", compress_gbps=1e9)
    assert fp16 == pytest.approx(ring / 2, rel=1e-3)
    sparse = dp_alone(exchange="sparse-switch", density=0.1)
    assert sparse == pytest.approx(dp_alone(exchange="switch") * 0.1, rel=1e-9)
    indep = dp_alone(exchange="sparse-switch", density=0.1, sparse_pattern="independent")
    assert indep == pytest.approx(dp_alone(exchange="switch") * (1 - 0.9 ** 8), rel=1e-9)
    assert dp_alone(exchange="auto", density=0.9, sparse_pattern="independent") == \
        pytest.approx(dp_alone(exchange="switch"), rel=1e-9)
    out = simulate(SimConfig("resnet50", spec, exchange="ring", compress="topk:ratio=0.01",
                             **base))
    assert all("all-gather" in c["algorithm"] for c in out["collectives"] if c["dim"] == "dp")


def test_recommenders_shard_or_replicate_embeddings() -> None:
    sharded = simulate(SimConfig("dlrm", "fattree", 16))
    assert _totals(sharded, "embedding")[0] == 2
    replicated = simulate(SimConfig("dlrm", "fattree", 16, replicate_embeddings=True))
    assert _totals(replicated, "embedding")[0] == 0
    assert _totals(replicated, "dp")[1] > 100 * _totals(sharded, "dp")[1]


def test_experts_all_to_all_and_their_own_gradients() -> None:
    out = simulate(SimConfig("gpt2-1.5b", "fattree", 16, "dp=8,tp=2,ep=4"))
    dims = {c["dim"] for c in out["collectives"]}
    assert {"ep", "dp-expert", "dp", "tp"} <= dims
    traffic = {c.dim: c for c in iteration_traffic(get_model("gpt2-1.5b"),
                                                   Parallelism(dp=8, tp=2, ep=4))}
    assert _totals(out, "ep")[0] == traffic["ep"].calls
    assert _totals(out, "ep")[1] == pytest.approx(traffic["ep"].total_bytes, rel=1e-9)


@pytest.mark.parametrize("kwargs, match", [
    (dict(topology="torus2d", accelerators=16, exchange="switch"), "ina=1"),
    (dict(accelerators=8, parallelism="dp=16"), "needs 16 accelerators"),
    (dict(accelerators=8, parallelism="pp=2,tp=8"), "exceeds"),
    (dict(workload="dlrm", accelerators=8, parallelism="tp=2"), "recommender"),
    (dict(exchange="carrier-pigeon"), "unknown exchange"),
    (dict(compress="adaptive"), "adaptive"),
    (dict(algorithm="butterfly"), "--algorithm"),
    (dict(dilation=0.5), "--dilation"),
])
def test_bad_input_is_one_config_error(kwargs: dict, match: str) -> None:
    args = {"workload": "resnet50", "topology": "fattree", "accelerators": 8, **kwargs}
    with pytest.raises(ConfigError, match=match):
        simulate(SimConfig(**args))
