"""The candidates' compressors, measured on this CPU."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from dlcomm.advise.candidates import (
    MAX_PEERS_TIMED,
    MAX_SIZES,
    SAMPLE,
    candidates,
    measure_method,
    measure_together,
    processes_for,
    sample_sizes,
)
from dlcomm.errors import ConfigError


def test_an_all_gathered_method_on_a_large_cluster_is_timed_on_a_few_peers():
    """top-k decompresses every peer's payload; on 20,000 workers that is timed on a few
    peers and extrapolated, not done 20,000 times (minutes), and the rate falls with the
    peers as the decompressions add up."""
    t0 = time.perf_counter()
    [many] = measure_method("topk:ratio=0.01", 20_000, sample=2**16)
    assert time.perf_counter() - t0 < 20
    [few] = measure_method("topk:ratio=0.01", MAX_PEERS_TIMED, sample=2**16)
    assert not many.summable and many.exchange == "ring"
    assert many.compress_bps < few.compress_bps / 50


def test_the_sizes_a_compressor_is_timed_at():
    """Each bucket's size within bounds (the largest that fits the memory), near ones
    (within a quarter) once, at most MAX_SIZES spread over them from the smallest to the
    largest."""
    big = 100 * SAMPLE
    assert sample_sizes([], big) == (SAMPLE,)
    assert sample_sizes([10, 10**9], big) == (SAMPLE, big)
    assert sample_sizes([10**9], SAMPLE // 2) == (SAMPLE,)  # never below the smallest
    assert sample_sizes([2 * SAMPLE, int(2.2 * SAMPLE), 3 * SAMPLE], big) == \
        (2 * SAMPLE, 3 * SAMPLE)
    many = sample_sizes([SAMPLE * 3**i // 2**i for i in range(12)], 8 * SAMPLE)
    assert len(many) == MAX_SIZES and many[0] == SAMPLE and many[-1] * 1.25 > 8 * SAMPLE
    assert list(many) == sorted(set(many))


def test_a_bucket_too_large_for_every_worker_is_timed_in_fewer_processes():
    """As many processes as share the cores, unless the memory holds fewer (one at least)."""
    gib = 2**30
    assert processes_for(2**20, 8, 16 * gib) == 8
    assert processes_for(2**27, 8, 16 * gib) == 3  # 4 GiB each, and torch
    assert processes_for(2**30, 8, 16 * gib) == 1
    assert processes_for(0, 3, 0) == 1


def test_a_catalog_models_compressors_are_timed_at_its_bucket_sizes():
    """Without the shapes, PowerSGD is timed on a flat bucket of each size: its ratio
    falls as the bucket grows (a wider matrix for the same rank), and each is kept. It is
    timed once for both exchanges (the same compression); fp16 saves nothing over the
    switch (which carries it as 32 bits) and is listed over the ring alone."""
    cands = candidates(4, ("fp16", "powersgd:rank=4"), bucket_elements=(SAMPLE, 4 * SAMPLE))
    assert [(c.method, c.exchange) for c in cands if c.method is not None] == [
        ("fp16", "ring"), ("powersgd:rank=4", "ring"), ("powersgd:rank=4", "switch")]
    ring, switch = (c for c in cands if c.method == "powersgd:rank=4")
    assert ring.sizes == switch.sizes
    for c in (ring, switch):
        assert [n for n, _, _ in c.sizes] == [SAMPLE, 4 * SAMPLE]
        (_, small, _), (_, large, rate) = c.sizes
        assert large < small and c.ratio == large and c.compress_bps == rate > 0


def test_one_timing_gives_each_exchange_its_wire():
    """A summable method is timed once for the ring and the switch: the same rate, and
    the wire as each carries it (float16 is widened to 32 bits on the switch)."""
    ring, switch = measure_method("fp16", 4, sample=2**16)
    assert (ring.exchange, switch.exchange) == ("ring", "switch")
    assert ring.compress_bps == switch.compress_bps
    assert (ring.ratio, switch.ratio) == (0.5, 1.0)


def test_workers_sharing_the_cores_are_timed_together_and_leave_nothing_running():
    """Timed in several processes at once, by CPU time: the same wire ratios as one
    process measures, one rate per job for all of its exchanges, no process left behind."""
    jobs = [("fp16", 2**16), ("powersgd:rank=4", 2**16)]
    together = measure_together(3, jobs, 4)
    alone = measure_together(1, jobs, 4)
    assert [[(c.exchange, c.ratio) for c in job] for job in together] == \
        [[(c.exchange, c.ratio) for c in job] for job in alone]
    for job in together:
        assert len({c.compress_bps for c in job}) == 1 and job[0].compress_bps > 0
    assert multiprocessing.active_children() == []


def test_a_failure_while_timing_together_is_the_methods_error_and_leaves_nothing():
    """A bad method fails in the measuring processes: its own error comes back (not a
    broken pool's, nor after a wait at the meeting point), and no process is left."""
    t0 = time.perf_counter()
    with pytest.raises(ConfigError):
        measure_together(2, [("fp16", 2**12), ("no-such-method", 2**12)], 2)
    assert time.perf_counter() - t0 < 60
    assert multiprocessing.active_children() == []
