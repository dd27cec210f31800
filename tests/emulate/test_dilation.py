"""Pure parts of time-dilated emulation."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dlcomm.emulate.dilation import (
    EmulateConfig,
    breakdown,
    intervals_union,
    nice_dilation,
    schedule_for,
)
from dlcomm.emulate.emulation import CAPACITY_SHARE, choose_dilation
from dlcomm.errors import ConfigError, RegistryError


def test_intervals_union():
    assert intervals_union([]) == 0
    assert intervals_union([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)
    assert intervals_union([(0, 10), (2, 3)]) == 10


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)).map(sorted), max_size=20))
def test_union_bounds(intervals):
    u = intervals_union([tuple(i) for i in intervals])
    assert u <= sum(b - a for a, b in intervals) + 1e-9
    assert u >= max((b - a for a, b in intervals), default=0) - 1e-9


@pytest.mark.parametrize("minimum,k", [(0.3, 1), (1, 1), (1.5, 2), (2, 2), (3, 5), (11.4, 20),
                                       (20.1, 50), (99, 100)])
def test_nice_dilation(minimum, k):
    assert nice_dilation(minimum) == k


def test_choose_dilation_scales_with_demand():
    capacity = 20e9
    k = choose_dilation(10e9, 8, capacity)
    assert k * CAPACITY_SHARE * capacity / 8 >= 10e9  # the links fit the machine
    assert choose_dilation(10e9, 8, capacity) >= choose_dilation(10e9, 4, capacity)
    assert choose_dilation(1e6, 2, capacity) == 1


def test_schedule_and_breakdown_real_scale():
    cfg = EmulateConfig("resnet50", workers=2, bandwidth_bps=10e9, dilation=10, iterations=2)
    sched = schedule_for(cfg)
    assert sched.gradient_bytes == 4 * 25_557_032  # every parameter in exactly one bucket
    assert list(sched.bucket_ready_s) == sorted(sched.bucket_ready_s)
    assert sched.bucket_ready_s[-1] <= sched.timing.backward_s + 1e-12
    compute = sched.timing.iteration_s
    rec = {"iteration_s": 10 * (compute + 0.05), "comm_busy_s": 10 * 0.08, "cpu_s": 1.0}
    # 3 iterations of warm-up: --warmup 1 and PowerSGD's 2 uncompressed ones
    gathered = [{"records": [rec, rec], "peak_rss_bytes": 1, "stats": {}, "warmup": 3}] * 2
    s = breakdown(cfg, sched, gathered)
    assert s["warmup_iterations"] == 3
    assert s["iteration_time_s"] == pytest.approx(compute + 0.05)
    assert s["exposed_comm_s"] == pytest.approx(0.05)
    assert s["overlap_s"] == pytest.approx(0.03)


@pytest.mark.parametrize("kwargs,error", [
    (dict(workload="alexnet9"), RegistryError), (dict(accelerator="tpu-v9"), RegistryError),
    (dict(dilation=0.5), ConfigError), (dict(exchange="pigeon"), RegistryError),
    (dict(batch=0), ConfigError)])
def test_bad_emulate_config(kwargs, error):
    base = dict(workload="resnet50", workers=2, bandwidth_bps=1e9)
    with pytest.raises(error):
        EmulateConfig(**{**base, **kwargs})


def test_gradient_buffers_are_gradient_like_and_differ_per_rank():
    from dlcomm.emulate.dilation import gradient_buffers
    a, b = gradient_buffers([1000, 10], 0), gradient_buffers([1000, 10], 1)
    assert [t.numel() for t in a] == [1000, 10]
    assert all(t.dtype == torch.float32 and bool((t != 0).all()) for t in a)
    assert not torch.equal(a[0], b[0]) and torch.equal(a[0], gradient_buffers([1000], 0)[0])
