"""Packet-level check of in-network aggregation: the switch's own dataplane in virtual time.

The flow model says an aggregated all-reduce of S bytes takes S / B (every worker streams
S up, the switch multicasts the S-byte sum down). The protocol that dlcomm runs adds what
a flow cannot see, and :func:`ina_packet_time` adds it in closed form:

1. packets: P = ceil(S / 4k) chunks of k int32 values, each w = 32 + 4k bytes on the
   wire, so the streaming time is P w / B;
2. self-clocking (SwitchML): a worker has W slots in flight and reuses a slot when its
   result returns, one round trip RTT = 2 latency + 2 w / B later (its packet, then the
   switch's result, each serialised once), so the window allows at most W packets per RTT:
   T >= ceil(P / W) RTT;
3. the exponent round that opens every slot costs one more round trip of header-only
   packets.

T = max(P w / B, ceil(P / W) RTT) + RTT_header. :func:`packet_check` runs the real worker
window (``exchange/switch/window.py``) and dataplane (``switch/dataplane.py``) over the
in-memory network of ``dlcomm.testing.fakenet`` and compares its virtual time with both the
flow model and this packet model, and its sum with numpy's.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.calibration import modelled_allreduce_s
from dlcomm.wire.packet import HEADER_SIZE, max_elements

__all__ = ["ina_packet_time", "packet_check"]


def ina_packet_time(nbytes: float, rate_bps: float, latency_s: float, k: int,
                    window: int) -> dict[str, float]:
    """The closed form of the module docstring, with its terms."""
    packets = math.ceil(nbytes / (4 * k))
    wire = HEADER_SIZE + 4 * k
    stream = packets * wire * 8 / rate_bps
    rtt = 2 * latency_s + 2 * wire * 8 / rate_bps
    windowed = math.ceil(packets / window) * rtt
    opening = 2 * latency_s + 2 * HEADER_SIZE * 8 / rate_bps
    return {"packets": packets, "stream_s": stream, "window_s": windowed,
            "opening_s": opening, "time_s": max(stream, windowed) + opening}


def packet_check(workers: int, nbytes: int, rate_bps: float, latency_s: float = 5e-6,
                 k: int = 1024, window: int = 8, seed: int = 0) -> dict[str, Any]:
    """Aggregate random float32 tensors through the fake network; compare (docstring)."""
    from dlcomm.testing.fakenet import NetConfig, aggregate

    if workers < 2 or nbytes < 4 or nbytes % 4:
        raise ConfigError("the packet check needs >= 2 workers and a size in whole float32s")
    if not 1 <= k <= max_elements() or window < 1:
        raise ConfigError(f"k must be in 1..{max_elements()} and window >= 1")
    if not rate_bps > 0 or latency_s < 0:
        raise ConfigError("the packet check needs a positive rate and latency >= 0")
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(nbytes // 4).astype(np.float32) for _ in range(workers)]
    start = time.perf_counter()
    run = aggregate(inputs, k=k, window=window,
                    net=NetConfig(latency_s=latency_s, rate_bps=rate_bps, seed=seed))
    wall = time.perf_counter() - start
    if any(run.errors):
        raise ConfigError(f"the fake network's aggregation failed: {run.errors}")
    exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
    flow = modelled_allreduce_s("switch", workers, nbytes, rate_bps)
    model = ina_packet_time(nbytes, rate_bps, latency_s, k, window)
    return {"workers": workers, "size_bytes": nbytes, "rate_bps": rate_bps,
            "latency_s": latency_s, "k": k, "window": window,
            "virtual_s": run.time_s, "flow_model_s": flow,
            "flow_model_error": flow / run.time_s - 1,
            "packet_model": model, "packet_model_error": model["time_s"] / run.time_s - 1,
            "max_abs_error_vs_float64": float(np.abs(run.outputs[0] - exact).max()),
            "bytes_sent_per_worker": int(run.net.bytes_sent[next(iter(run.net.bytes_sent))]),
            "wall_s": wall}
