"""The adaptive policy: its pipeline model, its greedy choice, and its behaviour on a fake
network (fast: no compression; slow: compression; a model that lies: reverted)."""

import time

import pytest

from dlcomm.exchange.compressed.adaptive import AdaptivePolicy, greedy_assignment, simulate_exposed
from dlcomm.exchange.compressed.assign import probe_spacing
from dlcomm.exchange.compressed.policy import CallRecord

NUMEL = 150_000
DENSE = NUMEL * 4


def test_simulated_exposure_of_buckets_run_in_order():
    assert simulate_exposed([0.0, 0.01, 0.02], [0.005] * 3) == pytest.approx(0.005)
    assert simulate_exposed([0.0, 0.01, 0.02], [0.02] * 3) == pytest.approx(0.04)
    assert simulate_exposed([0.0], [0.0]) == 0.0


def test_greedy_keeps_none_when_compression_does_not_pay():
    cost = [{"none": 0.001, "fp16": 0.0012, "powersgd": 0.004, "topk": 0.003}] * 2
    assert greedy_assignment([0.0, 0.01], cost) == ["none", "none"]


def test_greedy_compresses_exposed_buckets_and_prefers_the_least_lossy():
    slow = {"none": 0.1, "fp16": 0.05, "powersgd": 0.01, "topk": 0.008}
    assert greedy_assignment([0.0], [slow]) == ["topk"]
    # the first bucket's communication hides behind 50 ms of compute as fp16
    hidden = {"none": 0.08, "fp16": 0.04, "powersgd": 0.01, "topk": 0.01}
    quick = {"none": 0.001, "fp16": 0.001, "powersgd": 0.004, "topk": 0.004}
    assert greedy_assignment([0.0, 0.05], [hidden, quick]) == ["fp16", "none"]


class FakeNetwork:
    """Collective times from alpha + bytes / B, with a slowdown factor per method."""

    def __init__(self, bandwidth: float, alpha: float = 1e-3, slower: dict | None = None):
        self.bandwidth, self.alpha, self.slower = bandwidth, alpha, slower or {}

    WIRE = {"none": 1.5 * DENSE, "fp16": 0.75 * DENSE, "powersgd": 0.05 * DENSE,
            "topk": 3 * (8 * NUMEL // 100 + 16)}
    COMPUTE = {"none": 0.0, "fp16": 2e-4, "powersgd": 3e-3, "topk": 2e-3}

    def record(self, method: str, iteration: int, start: float) -> CallRecord:
        wire, compute = self.WIRE[method], self.COMPUTE[method]
        comm = (self.alpha + wire / self.bandwidth) * self.slower.get(method, 1.0)
        collectives = [(int(wire), comm)]
        return CallRecord("0:150000", NUMEL, iteration, method, submitted=start, started=start,
                          finished=start + compute + comm, comm_s=comm, wire_bytes=int(wire),
                          collectives=collectives)


def run_policy(policy: AdaptivePolicy, network: FakeNetwork, iterations: int) -> list[str]:
    # the fake network's costs instead of a timed trial on this (busy) machine
    policy.compute["0:150000"] = {m: c for m, c in network.COMPUTE.items() if m in policy.methods}
    policy.wire["0:150000"] = {m: w for m, w in network.WIRE.items() if m in policy.methods}
    methods, t = [], 0.0
    for it in range(iterations):
        chosen = policy.choose("0:150000", NUMEL, it)
        record = network.record(chosen.name, it, t)
        policy.observe(record)
        methods.append(chosen.name)
        t = record.finished + 0.02  # 20 ms of forward/backward before the next bucket
    return methods


def identity(values: list[float]):
    """The workers' agreement: one worker, and the fake network's 1 ms latency."""
    time.sleep(1e-3)
    return lambda: list(values)


def test_fast_network_stays_uncompressed():
    policy = AdaptivePolicy(4, identity, every=2, probe=10)
    methods = run_policy(policy, FakeNetwork(bandwidth=5e9), 60)
    assert set(methods) == {"none"}
    assert not any(d.get("switched") for d in policy.decisions)


def test_slow_network_compresses_at_once_and_prices_its_probes():
    policy = AdaptivePolicy(4, identity, every=2, probe=10)
    methods = run_policy(policy, FakeNetwork(bandwidth=12.5e6), 120)
    # trials in iteration 2, a decision at 3, compressed from 4 (a decisive gain)
    assert methods[:4] == ["none"] * 4 and methods[4] == "powersgd"
    assert "topk" not in methods  # on request only
    # a probe costs ~70 ms more than a compressed iteration of ~95 ms (the fake network's
    # 20 ms of compute and its slow links): spaced out so that they cost <= 2%
    gap = policy.probe_gap
    assert 10 < gap <= 40
    probes = [i for i, m in enumerate(methods) if m == "none" and i > 4]
    assert 1 <= len(probes) <= 3 and probes == sorted(policy.probes)
    assert all(b - a >= 10 for a, b in zip(probes, probes[1:]))  # never back to back
    assert probe_spacing(0.0, 0.03, 10) == 10 and probe_spacing(1.0, 0.03, 10) == 40
    assert probe_spacing(0.0119, 0.03, 10) == 20   # 11.9 ms / (2% of 30 ms)
    assert probe_spacing(0.01, 0.0, 10) == 40 and probe_spacing(0.01, 0.03, 0) == 1
    steps = policy.stats()["adaptive"]["steps"]
    assert steps[-1]["bandwidth_Bps"] == pytest.approx(12.5e6, rel=0.2)


def test_top_k_when_asked_for():
    policy = AdaptivePolicy(4, identity, every=2, probe=10,
                            candidates=("none", "fp16", "powersgd", "topk"))
    methods = run_policy(policy, FakeNetwork(bandwidth=12.5e6), 30)
    assert methods[-1] == "topk"  # the cheapest step on these links, once it is a candidate


def test_a_switch_that_does_not_pay_is_reverted_and_banned():
    """The model expects fp16 to halve the time, but this network sums halves 4x slower."""
    policy = AdaptivePolicy(4, identity, every=2, probe=0, candidates=("none", "fp16"))
    network = FakeNetwork(bandwidth=20e6, slower={"fp16": 4.0})
    methods = run_policy(policy, network, 40)
    assert "fp16" in methods and methods[-1] == "none"
    assert any(d.get("reverted") for d in policy.decisions)
    assert ("0:150000", "fp16") in policy.banned


def test_changing_rate_mid_run():
    """Fast then slow: none, then compression; slow then fast again: the probes bring it
    back to none."""
    policy = AdaptivePolicy(4, identity, every=2, probe=6)
    fast = run_policy(policy, FakeNetwork(bandwidth=5e9), 30)
    network = FakeNetwork(bandwidth=10e6)
    t = 100.0
    slow = []
    for it in range(30, 70):
        chosen = policy.choose("0:150000", NUMEL, it)
        record = network.record(chosen.name, it, t)
        policy.observe(record)
        slow.append(chosen.name)
        t = record.finished + 0.02
    assert set(fast) == {"none"}
    assert slow[-1] in ("topk", "powersgd")
    network, again = FakeNetwork(bandwidth=5e9), []
    for it in range(70, 130):
        chosen = policy.choose("0:150000", NUMEL, it)
        record = network.record(chosen.name, it, t)
        policy.observe(record)
        again.append(chosen.name)
        t = record.finished + 0.02
    assert again[-10:] == ["none"] * 10


def test_a_relaxation_that_costs_time_is_reverted():
    """PowerSGD turns out 3x slower than modelled, so fp16 is predicted no slower; but this
    network sums halves 4x slower: going back to less compression is measured too."""
    policy = AdaptivePolicy(4, identity, every=2, probe=0,
                            candidates=("none", "fp16", "powersgd"))
    network = FakeNetwork(bandwidth=1e8, slower={"powersgd": 3.0, "fp16": 4.0})
    methods = run_policy(policy, network, 40)
    assert methods[4] == "powersgd" and "fp16" in methods and methods[-1] == "powersgd"
    assert any(d.get("reverted") for d in policy.decisions)
    assert ("0:150000", "fp16") in policy.banned


def test_direct_path_releases_once_when_the_inner_exchange_raises():
    """A failing inner exchange: the caller sees the error, and the policy is free again
    (one release, not two: the next call is not mistaken for a second owner)."""
    from dlcomm.exchange.compressed.direct import DirectPath

    class Broken:
        def stats(self):
            class S:
                bytes_sent = 0
            return S()

        def allreduce(self, flat, key):
            raise RuntimeError("link down")

    path = DirectPath()
    assert path.try_enter()
    with pytest.raises(RuntimeError, match="link down"):
        try:
            path.start(Broken(), None, CallRecord("b", 1, 0, "none"), lambda *a: None)
        finally:
            path.release()          # what CompressedExchange._direct does
    assert path.in_flight == 0 and path.try_enter()
