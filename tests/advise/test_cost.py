"""The advisor's cost model (pure): bucket times, the timeline, limits, ranking."""

from dataclasses import replace

import pytest

from dlcomm.advise.cost import (
    Candidate,
    Cluster,
    Constants,
    bucket_time,
    predict,
    protocol_cpu_s,
    switch_link_efficiency,
    sync_costs,
    tcp_link_efficiency,
)
from dlcomm.advise.profile import JobProfile
from dlcomm.advise.run import (
    KNOWN_ERROR,
    SHARED_RING_ERROR,
    advise_result,
    known_error,
    machine_factor,
    rank,
    ring_fixed_share,
    straggler_clusters,
    sweep,
)
from dlcomm.advise.verify import median_step_time, run_order, score, train_args_for
from dlcomm.errors import ConfigError
from dlcomm.exchange.switch.exchange import auto_sparse_below
from dlcomm.timeline import finish_time
from dlcomm.workloads.catalog.compute import Bucket

K = Constants()
MB = 10**6


def job(compute_s=0.01, sizes=(4 * MB,), density=1.0):
    backward = compute_s * 2 / 3
    buckets = tuple(Bucket(i, (f"b{i}",), s // 4, s, backward * (i + 1) / len(sizes))
                    for i, s in enumerate(sizes))
    return JobProfile("toy", compute_s / 3, compute_s * 2 / 3, 0.0, buckets, density)


def test_timeline_waits_for_readiness_and_the_previous_bucket():
    assert finish_time([0.0, 0.0], [1.0, 1.0]) == 2.0
    assert finish_time([0.0, 5.0], [1.0, 1.0]) == 6.0
    assert finish_time([2.0, 2.5], [1.0, 1.0]) == 4.0


def test_ring_and_switch_follow_their_byte_counts():
    c = Cluster(4, 1e9)
    ring, _ = bucket_time(4 * MB, Candidate("ring"), job(), c, K)
    switch, terms = bucket_time(4 * MB, Candidate("switch"), job(), c, K)
    # ring: 2(n-1)/n = 1.5 x the bytes; switch: 1 x (plus small fixed costs)
    assert ring == pytest.approx(2 * 3 * K.ring_alpha_s + 1.5 * 32e6 / (K.ring_efficiency * 1e9))
    assert switch == pytest.approx(K.switch_overhead_s + 32e6 / (K.switch_efficiency * 1e9))
    assert max(terms, key=terms.get) == "links"


def test_the_switch_cpu_limits_at_high_rates():
    c = Cluster(8, 100e9)
    p = predict(job(0.001), Candidate("switch"), c, K)
    assert p.limiter == "switch CPU"  # 8 x 32 Mbit at 10 Gbit/s per core > the links


def test_compute_bound_jobs_are_limited_by_compute():
    p = predict(job(compute_s=1.0, sizes=(MB, MB, MB)), Candidate("ring"), Cluster(4, 100e9),
                K)
    assert p.limiter == "compute" and p.exposed_share < 0.1


def test_sparse_pays_only_with_sparse_gradients():
    c = Cluster(4, 1e9)
    # 1% of the blocks: 40 KB on the wire and its Python rounds, against 4 MB
    dense, sparse = job(density=1.0), job(density=0.01)
    assert predict(sparse, Candidate("sparse-switch"), c, K).iteration_s < \
        predict(sparse, Candidate("switch"), c, K).iteration_s
    assert predict(dense, Candidate("auto"), c, K).iteration_s == \
        pytest.approx(predict(dense, Candidate("switch"), c, K).iteration_s)


@pytest.mark.parametrize("workers", [4, 8])
def test_auto_is_priced_as_it_decides_not_as_the_faster(workers):
    """auto runs sparse rounds only below its density threshold (what the exchange and the
    simulator do), even where sparse rounds would be faster above it."""
    c = Cluster(workers, 1e9, cpu_factor=2.0)
    threshold = auto_sparse_below(workers)
    above = job(density=threshold + 0.05)
    sparse, _ = bucket_time(4 * MB, Candidate("sparse-switch"), above, c, K)
    dense, _ = bucket_time(4 * MB, Candidate("switch"), above, c, K)
    assert sparse < dense  # at 1 Gbit/s the sparse rounds still pay here...
    auto, _ = bucket_time(4 * MB, Candidate("auto"), above, c, K)
    assert auto == pytest.approx(dense)  # ...yet auto goes dense
    below = job(density=threshold - 0.05)
    assert bucket_time(4 * MB, Candidate("auto"), below, c, K)[0] == pytest.approx(
        bucket_time(4 * MB, Candidate("sparse-switch"), below, c, K)[0])


def test_a_sparse_result_carries_the_union_of_the_workers_blocks():
    c = Cluster(4, 1e9)
    own = job(density=0.01)
    union = replace(own, union_density=0.04)
    assert own.result_density == 0.01 and union.result_density == 0.04
    _, alone = bucket_time(4 * MB, Candidate("sparse-switch"), own, c, K)
    _, spread = bucket_time(4 * MB, Candidate("sparse-switch"), union, c, K)
    # the links carry the union back to every worker; the switch adds what each sends
    assert spread["links"] == pytest.approx(4 * alone["links"])
    assert spread["switch CPU"] == pytest.approx(alone["switch CPU"])
    assert spread["worker CPU"] > alone["worker CPU"]


def test_compression_trades_bytes_for_cpu():
    c = Cluster(4, 1e8)
    cheap = Candidate("ring", "fp16", 0.5, True, 1e12)
    slow = Candidate("ring", "fp16", 0.5, True, 1e6)
    assert predict(job(), cheap, c, K).iteration_s < predict(job(), Candidate("ring"), c,
                                                             K).iteration_s
    assert predict(job(), slow, c, K).limiter == "worker CPU"
    gathered = Candidate("ring", "topk:ratio=0.01", 0.02, False, 1e12)
    t, _ = bucket_time(MB, gathered, job(), c, K)
    assert t == pytest.approx(3 * K.ring_alpha_s + 3 * 8 * 0.02 * MB / (1e8 * K.ring_efficiency)
                              + 8 * MB / 1e12
                              + K.round_s)
    # an all-gather's first round (the sizes) pays the gather's n - 1 messages again, not
    # a ring all-reduce's 2(n - 1)
    sized, _ = bucket_time(MB, replace(gathered, rounds=2), job(), c, K)
    assert sized - t == pytest.approx(3 * K.ring_alpha_s + K.round_s)


def test_a_bucket_is_priced_at_the_rate_and_ratio_measured_nearest_its_size():
    """A compressor's rate falls as its bucket outgrows the caches (PowerSGD's ratio falls
    too): each bucket takes those measured at the size nearest its own, by ratio."""
    sizes = ((2**20, 0.008, 8e9), (8 * 2**20, 0.003, 3e9))
    cand = Candidate("switch", "powersgd:rank=4", 0.003, True, 3e9, rounds=2, sizes=sizes)
    assert cand.at(2**20) == (0.008, 8e9)
    assert cand.at(2 * 2**20) == (0.008, 8e9)      # 2x from 1M, 4x from 8M
    assert cand.at(5 * 2**20) == (0.003, 3e9)      # 5x from 1M, 1.6x from 8M
    assert cand.at(10**9) == (0.003, 3e9)
    assert replace(cand, sizes=()).at(2**20) == (0.003, 3e9)
    c = Cluster(4, 1e10)
    nbytes = 4 * 2**20  # a bucket of 1 Mi elements: 8 Gbit/s, 0.8% on the wire
    small, small_terms = bucket_time(nbytes, cand, job(), c, K)
    flat, flat_terms = bucket_time(nbytes, replace(cand, sizes=()), job(), c, K)
    # the compressor's time, less the switch client's for the larger payload
    assert flat_terms["worker CPU"] - small_terms["worker CPU"] == pytest.approx(
        8 * nbytes / 3e9 - 8 * nbytes / 8e9 - 8 * nbytes * (0.008 - 0.003) / K.client_rate_bps)
    assert small_terms["links"] == pytest.approx(flat_terms["links"] * 0.008 / 0.003)
    assert small < flat


def test_ranking_sweep_and_result():
    cands = [Candidate("ring"), Candidate("switch")]
    c = Cluster(4, 1e9)
    preds = rank(job(), cands, c, K)
    assert [p.candidate for p in preds] == ["switch", "ring"]
    sw = sweep(job(), cands, c, K)
    assert sw["pays_bps"]["ring"] is None
    low, high = sw["pays_bps"]["switch"]
    assert low == sw["link_bps"][0] and high >= low
    assert sw["speedup_over_ring"]["ring"] == [1.0] * len(sw["link_bps"])
    # the switch pays most at slow links (half the ring's bytes on the wire)
    speedups = sw["speedup_over_ring"]["switch"]
    assert speedups[0] > 1.3 and speedups[0] == max(speedups)
    result = advise_result(job(), cands, c, K, {"workload": "toy"})
    assert result["kind"] == "advise" and result["summary"]["recommendation"] == "switch"
    assert result["summary"]["confidence"]["level"] in ("high", "medium", "low")


def test_a_step_measured_on_shared_cores_bounds_its_prediction():
    c = Cluster(4, 1e9)
    free = rank(job(), [Candidate("ring"), Candidate("switch")], c, K)
    model = {p.candidate: p.iteration_s for p in free}
    # the switch's loopback step above its model, the ring's below its own
    cands = [Candidate("ring", floor_s=model["ring"] / 2),
             Candidate("switch", floor_s=2 * model["ring"])]
    preds = {p.candidate: p for p in rank(job(), cands, c, K)}
    assert preds["ring"].iteration_s == model["ring"] and preds["ring"].limiter != "cores"
    sw = preds["switch"]
    assert sw.iteration_s == 2 * model["ring"] and sw.limiter == "cores"
    unbound = next(p for p in free if p.candidate == "switch")
    assert sw.terms["cores"] == sw.iteration_s and sw.compute_s == unbound.compute_s
    # the step's excess over the model is the cores' contention, not exposed communication
    assert sw.exposed_s == unbound.exposed_s and sw.exposed_share < unbound.exposed_share
    assert [p.candidate for p in rank(job(), cands, c, K)] == ["ring", "switch"]
    # no faster link makes it faster: at 100 Gbit/s the bound still holds (the ring takes
    # at most its 1 Gbit/s time there), where slow links price both by their bytes
    speedups = sweep(job(), cands, c, K)["speedup_over_ring"]["switch"]
    assert speedups[-1] <= 0.5 + 1e-9 and speedups[0] > 1
    rows = advise_result(job(), cands, c, K, {"workload": "toy"})["candidates"]
    assert {r["candidate"]: r["floor_s"] for r in rows} == {
        "ring": model["ring"] / 2, "switch": 2 * model["ring"]}


def test_bsp_pays_the_stragglers_sleep_beyond_what_the_others_fill():
    toy = job(compute_s=0.3)  # forward 0.1 s, backward 0.2 s
    c = Cluster(4, 1e9)
    assert straggler_clusters(toy, c, None) == (c, c)
    # own cores: the trainer's 4x straggler sleeps 3 x 3 x its forward
    bsp, fast = straggler_clusters(toy, c, (1, 4.0))
    assert bsp.delay_s == pytest.approx(0.9) and fast == c
    slow = predict(toy, Candidate("ring"), bsp, K)
    assert slow.compute_s == pytest.approx(predict(toy, Candidate("ring"), c, K).compute_s + 0.9)
    # with emulated compute it sleeps 4 x it where the others sleep 1 x
    emulated = replace(toy, emulated_s=0.05)
    assert straggler_clusters(emulated, c, (1, 4.0))[0].delay_s == pytest.approx(0.15)
    # shared cores: the others' compute (0.3 s x 2) fills 0.6 s of its 0.1 + 0.9 + 0.2 s
    shared = replace(c, compute_factor=2.0, cpu_factor=2.0)
    bsp, fast = straggler_clusters(toy, shared, (1, 4.0))
    assert bsp.delay_s == pytest.approx(1.2 - 0.6)
    # ... and its idle share speeds the others: 3 + 1/4 workers share the cores, not 4
    assert fast.compute_factor == pytest.approx(2.0 * 3.25 / 4)
    assert fast.cpu_factor == pytest.approx(2.0 * 3.25 / 4) and fast.delay_s == 0.0
    # a sleep the others' compute covers costs bsp nothing
    assert straggler_clusters(job(compute_s=0.003), replace(c, compute_factor=8.0),
                              (1, 1.5))[0].delay_s == 0.0


def test_decentralized_protocols_price_their_own_exchange():
    toy, c = job(compute_s=0.5, sizes=(100 * MB,)), Cluster(8, 1e9)
    hop = predict(toy, Candidate("ring", sync="hop"), c, K)
    prague = predict(toy, Candidate("ring", sync="prague"), c, K)
    links, cpu, overlaps = sync_costs(100 * MB, "hop", c, K)
    assert overlaps and links == pytest.approx(2 * 8 * 100 * MB / (1e9 * K.ring_efficiency))
    # hop's two models cross the links during the 0.5 s of compute; what is left shows
    assert hop.iteration_s == pytest.approx(0.5 + cpu + links - 0.5)
    p_links, p_cpu, p_overlaps = sync_costs(100 * MB, "prague", c, K)
    assert not p_overlaps and prague.iteration_s == pytest.approx(0.5 + p_cpu + p_links)
    assert hop.iteration_s != prague.iteration_s
    # the straggler does not slow the others' steps
    preds = {p.candidate: p for p in rank(toy, [Candidate("ring"),
                                                Candidate("ring", sync="hop")], c, K, (1, 4.0))}
    assert preds["ring --sync hop"].iteration_s == pytest.approx(hop.iteration_s)
    assert preds["ring"].iteration_s > predict(toy, Candidate("ring"), c, K).iteration_s + 1.0


@pytest.mark.parametrize("factor", [1.0, 4.0])
@pytest.mark.parametrize("emulated", [0.0, 0.03])
@pytest.mark.parametrize("sync", ["hop", "prague"])
def test_a_measured_protocol_iteration_is_given_back(factor, emulated, sync):
    toy = replace(job(compute_s=0.006, sizes=(600_000,)), emulated_s=emulated)
    c = Cluster(8, 1e9, compute_factor=factor, cpu_factor=factor)
    for measured in (0.09, 0.15):
        cpu = protocol_cpu_s(measured, toy, sync, c, K)
        assert cpu > 0
        got = predict(toy, Candidate("ring", sync=sync, iteration_cpu_s=cpu), c, K)
        assert got.iteration_s == pytest.approx(measured)
    # an iteration faster than the model's floor means no protocol cost, not a negative one
    assert protocol_cpu_s(0.001, toy, sync, c, K) == 0.0


def test_link_efficiencies_are_the_frames_headers():
    # jumbo frames: 8,948 bytes of TCP payload in a 9,014-byte frame, half a 66-byte ACK
    assert tcp_link_efficiency(9000) == pytest.approx(8948 / (9014 + 33))
    # the switch's frame-sized packet: 2,048 elements, 76 bytes of headers and tag
    assert switch_link_efficiency(9000) == pytest.approx(8192 / (8192 + 76 + 14))
    assert switch_link_efficiency(1500) == pytest.approx(1024 / (1024 + 76 + 14))
    assert tcp_link_efficiency(1500) < tcp_link_efficiency(9000) < 1
    k = Constants()  # the defaults are the emulated links' (MTU 9000), where --verify runs
    assert k.ring_efficiency == tcp_link_efficiency(9000)
    assert k.switch_efficiency == switch_link_efficiency(9000)


def test_machine_factor():
    assert machine_factor(4, cores=2) == 2.0
    assert machine_factor(2, cores=8) == 1.0
    assert machine_factor(8, cores=2) == 4.0 and machine_factor(3, cores=8) == 1.0


def test_bad_cluster():
    with pytest.raises(ConfigError, match="--workers must be >= 2"):
        Cluster(1, 1e9)


def test_repeated_runs_take_turns_and_score_their_median():
    assert run_order(3, 1) == [0, 1, 2]
    order = run_order(3, 3)
    assert order == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    for i in range(3):  # once a round, and once in each place
        assert sorted(order[3 * i:3 * i + 3]) == [0, 1, 2]
        assert sorted(order[3 * r + i] for r in range(3)) == [0, 1, 2]
    with pytest.raises(ValueError):
        run_order(2, 0)
    preds = [{"candidate": "switch", "iteration_s": 0.05},
             {"candidate": "ring", "iteration_s": 0.08}]
    out = score(preds, {"switch": [0.06, 0.30, 0.05], "ring": [0.09, 0.08, 0.10]})
    assert out["repeats"] == 3
    assert out["rows"][0]["measured_s"] == 0.06  # the slow spell of one run does not count
    assert out["rows"][0]["measured_runs_s"] == [0.06, 0.30, 0.05]
    rounds = out["rows"][0]["measured_speedup_rounds"]   # ring / switch, round by round
    assert rounds == pytest.approx([0.09 / 0.06, 0.08 / 0.30, 0.10 / 0.05])
    assert out["recommended_speedup_rounds"] == rounds
    assert out["rows"][0]["predicted_within_rounds"]     # 1.6 lies in [0.27, 2.0]
    tight = score(preds, {"switch": [0.06, 0.06], "ring": [0.09, 0.09]})
    assert not tight["rows"][0]["predicted_within_rounds"]  # 1.6 against 1.5 and 1.5


def test_verification_scoring():
    preds = [{"candidate": "switch", "iteration_s": 0.05},
             {"candidate": "ring", "iteration_s": 0.08}]
    out = score(preds, {"switch": [0.06], "ring": [0.09]})
    assert out["recommendation_ok"] and out["measured_fastest"] == "switch"
    row = out["rows"][0]
    assert row["error"] == pytest.approx(0.05 / 0.06 - 1)
    assert row["speedup_error"] == pytest.approx((0.08 / 0.05) / (0.09 / 0.06) - 1)
    assert out["recommended_speedup_error"] == pytest.approx(row["speedup_error"])
    wrong = score(preds, {"switch": [0.10], "ring": [0.09]})
    assert not wrong["recommendation_ok"] and wrong["measured_fastest"] == "ring"
    assert median_step_time([{"step_time_s": t} for t in (9, 1, 2, 3)], 1) == 2
    assert train_args_for({"exchange": "switch", "method": "fp16", "sync": "bsp"}) == \
        ["--exchange", "switch", "--compress", "fp16"]
    assert train_args_for({"exchange": "ring", "method": None, "sync": "hop"}) == \
        ["--exchange", "ring", "--sync", "hop"]


def test_the_report_shows_the_recommendations_round_by_round_range():
    from rich.console import Console

    from dlcomm.advise.report import print_advice
    result = advise_result(job(), [Candidate("ring"), Candidate("switch")], Cluster(4, 1e9), K,
                           {"workload": "toy"})
    result["verify"] = score(result["predictions"],
                             {"switch": [0.06, 0.05, 0.07], "ring": [0.09, 0.10, 0.08]})
    console = Console(record=True, width=200)
    print_advice(result, console)
    text = console.export_text()
    assert "medians of 3 runs" in text
    assert "round by round 1.14x-2.00x" in text   # 0.08/0.07 .. 0.10/0.05


def test_the_known_error_widens_where_a_latency_bound_ring_shares_the_cores():
    small = job(compute_s=0.002, sizes=(605_224,))   # digits-cnn's one bucket
    shared_fast = Cluster(4, 10e9, compute_factor=2.0, cpu_factor=2.0)
    shared_slow = Cluster(4, 100e6, compute_factor=2.0, cpu_factor=2.0)
    own_cores = Cluster(4, 10e9)
    # 6 messages x 2 x 0.43 ms against 0.7 ms of bytes: mostly fixed costs
    assert ring_fixed_share(small, shared_fast, K) > 0.8
    assert ring_fixed_share(small, shared_slow, K) < 0.1  # 73 ms of bytes at 100 Mbit/s
    assert known_error(small, shared_fast, K) == (
        SHARED_RING_ERROR, "workers sharing this machine's cores, a ring of mostly fixed costs")
    assert known_error(small, shared_slow, K)[0] == KNOWN_ERROR
    # the ring's step on those cores measured: its waits inside training are in it
    assert known_error(small, shared_fast, K, bounded=True)[0] == KNOWN_ERROR
    bounded = advise_result(small, [Candidate("ring", floor_s=1.0), Candidate("switch")],
                            shared_fast, K, {"workload": "toy"})["summary"]["confidence"]
    assert bounded["known_error"] == KNOWN_ERROR
    # a loopback step below the ring's modelled one bounds nothing: the model's error stands
    below = advise_result(small, [Candidate("ring", floor_s=1e-6), Candidate("switch")],
                          shared_fast, K, {"workload": "toy"})["summary"]["confidence"]
    assert below["known_error"] == SHARED_RING_ERROR
    assert known_error(small, own_cores, K)[0] == KNOWN_ERROR  # no sharing: the model's
    # a calibration's worst fit widens it where larger, and is kept where it is the larger
    assert known_error(small, own_cores, K, fitted=0.2) == (0.2, "the calibration's worst fit")
    assert known_error(small, shared_fast, K, fitted=0.4)[0] == 0.4
    assert known_error(small, own_cores, K, fitted=0.05)[0] == KNOWN_ERROR
    confidence = advise_result(small, [Candidate("ring"), Candidate("switch")], shared_fast,
                               K, {"workload": "toy"})["summary"]["confidence"]
    assert confidence["known_error"] == SHARED_RING_ERROR
    assert "sharing this machine's cores" in confidence["meaning"]
    assert confidence["known_error_from"].startswith("workers sharing")
