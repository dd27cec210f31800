"""The candidates' compressors, measured on this CPU."""

from __future__ import annotations

import time

from dlcomm.advise.candidates import MAX_PEERS_TIMED, measure_method


def test_an_all_gathered_method_on_a_large_cluster_is_timed_on_a_few_peers():
    """top-k decompresses every peer's payload; on 20,000 workers that is timed on a few
    peers and extrapolated, not done 20,000 times (minutes), and the rate falls with the
    peers as the decompressions add up."""
    t0 = time.perf_counter()
    many = measure_method("topk:ratio=0.01", 20_000, "ring", sample=2**16)
    assert time.perf_counter() - t0 < 20
    few = measure_method("topk:ratio=0.01", MAX_PEERS_TIMED, "ring", sample=2**16)
    assert not many.summable and many.exchange == "ring"
    assert many.compress_bps < few.compress_bps / 50
