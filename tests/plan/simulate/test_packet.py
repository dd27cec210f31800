"""Packet-level check: dlcomm's switch dataplane and worker window in virtual time."""

from __future__ import annotations

import pytest

from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.packet import ina_packet_time, packet_check


def test_bandwidth_bound_aggregation_runs_at_the_flow_models_s_over_b() -> None:
    r = packet_check(4, 4 * 2**20, 1e9, latency_s=5e-6, k=15872, window=8)
    assert abs(r["flow_model_error"]) < 0.03          # headers and the opening round trip
    assert abs(r["packet_model_error"]) < 0.01
    assert r["max_abs_error_vs_float64"] < 1e-5


def test_window_bound_aggregation_is_what_self_clocking_allows() -> None:
    """A small window over a long round trip: the flow model is far off, the packet
    model (ceil(P/W) round trips) is not."""
    r = packet_check(4, 2**19, 1e9, latency_s=50e-6, k=256, window=4)
    assert r["flow_model_error"] < -0.5
    assert abs(r["packet_model_error"]) < 0.01
    model = r["packet_model"]
    assert model["window_s"] > model["stream_s"]


def test_packet_time_terms() -> None:
    t = ina_packet_time(4 * 1024 * 10, 8e9, 1e-6, k=1024, window=2)
    assert t["packets"] == 10
    assert t["stream_s"] == pytest.approx(10 * (32 + 4096) / 1e9)
    rtt = 2e-6 + 2 * (32 + 4096) / 1e9
    assert t["window_s"] == pytest.approx(5 * rtt)
    assert t["time_s"] == pytest.approx(max(t["stream_s"], 5 * rtt) + 2e-6 + 64 / 1e9)


def test_bad_packet_check_input() -> None:
    with pytest.raises(ConfigError):
        packet_check(1, 1024, 1e9)
    with pytest.raises(ConfigError):
        packet_check(4, 1023, 1e9)
