"""The kernel-level compute model: waves, pipeline fill, the roofline, clear refusals."""

from __future__ import annotations

import math

import pytest

from dlcomm.errors import ConfigError
from dlcomm.workloads.accelerators import get_accelerator
from dlcomm.workloads.kernels import K_FILL, LAUNCH_S, KernelModel

A100 = get_accelerator("a100")
KM = KernelModel(A100)
PER_SM = A100.peak_flops * A100.gemm_ceiling / A100.sms


def test_one_full_wave_of_large_tiles_runs_at_the_ceiling() -> None:
    # 108 tiles of 256 x 128: exactly one wave
    m, n, k = 256 * 12, 128 * 9, 8192
    t = KM.gemm(m, n, k)
    assert t == pytest.approx(2 * 256 * 128 * (k + K_FILL) / PER_SM + LAUNCH_S)
    assert 2 * m * n * k / (t - LAUNCH_S) / A100.peak_flops == pytest.approx(
        A100.gemm_ceiling * k / (k + K_FILL))


def test_one_tile_more_costs_a_wave() -> None:
    base = KM.gemm(256 * 12, 128 * 9, 4096)
    assert KM.gemm(256 * 12 + 1, 128 * 9, 4096) > 1.5 * base - LAUNCH_S


def test_short_k_is_slow_and_memory_bound_shapes_hit_the_roofline() -> None:
    long_k = KM.gemm(4096, 4096, 4096)
    short_k = KM.gemm(4096, 4096, 64) * 64
    assert short_k > 2 * long_k            # the fill dominates a 64-deep product
    # attention scores of one head: s x s x 64 moves more bytes than it computes
    s, dh = 2048, 64
    t = KM.gemm(s, s, dh, batch=64)
    assert t >= 2 * (2 * s * dh + s * s) * 64 / KM.memory_rate


def test_memory_kernels_and_zero_work() -> None:
    assert KM.memory(1e9) == pytest.approx(1e9 / (A100.memory_Bps * A100.memory_ceiling)
                                           + LAUNCH_S)
    assert KM.memory(0) == 0 and KM.gemm(0, 10, 10) == 0


def test_accelerators_without_kernel_facts_are_refused() -> None:
    with pytest.raises(ConfigError, match="kernel-model facts"):
        KernelModel(get_accelerator("v100"))


def test_h100_is_faster_than_a100_on_every_shape() -> None:
    h100 = KernelModel(get_accelerator("h100"))
    for m, n, k in ((8192, 8192, 8192), (2048, 2048, 128), (32768, 768, 3072)):
        assert h100.gemm(m, n, k) < KM.gemm(m, n, k)
    assert not math.isnan(h100.memory(1.0))
