"""Fixed-point quantization: no overflow, the documented error bound, adversarial inputs."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dlcomm.wire.quant import (
    EXP_NONFINITE,
    EXP_ZERO,
    chunk_exponents,
    dequantize_into,
    error_bound,
    log2_workers,
    quantize,
)

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def switch_sum(xs, k):
    """What workers and a switch compute, without a network."""
    n = len(xs)
    exps = np.max([chunk_exponents(x, k) for x in xs], axis=0)
    out = np.empty(len(xs[0]), np.float32)
    for c, e in enumerate(exps):
        lo, hi = c * k, min((c + 1) * k, len(out))
        qs = [quantize(x[lo:hi], int(e), n).astype(np.int64) for x in xs]
        total = np.sum(qs, axis=0)
        assert np.abs(total).max(initial=0) < 2**31  # the int32 sum can never overflow
        dequantize_into(out[lo:hi], total.astype(np.int32), int(e), n)
    return out, exps


def float32_ulp(values):
    """One float32 ulp at each float64 value (computed in float64: no overflow)."""
    return np.ldexp(1.0, np.frexp(np.abs(values))[1] - 24)


def check_bound(xs, k):
    out, exps = switch_sum(xs, k)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    top = float(np.finfo(np.float32).max)
    for c, e in enumerate(exps):
        lo, hi = c * k, min((c + 1) * k, len(out))
        bound = error_bound(int(e), len(xs))
        got, want = out[lo:hi].astype(np.float64), exact[lo:hi]
        inf = np.isinf(got)
        # +-inf only where the exact sum is within the bound of float32's range, as IEEE gives
        assert (np.abs(want[inf]) + bound + float32_ulp(want[inf]) >= top).all()
        err = np.abs(got[~inf] - want[~inf])
        assert (err <= bound + float32_ulp(want[~inf])).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 70), st.integers(1, 9), st.data())
def test_sum_within_bound(n, length, k, data):
    xs = [data.draw(arrays(np.float32, length, elements=finite32)) for _ in range(n)]
    check_bound(xs, k)


@pytest.mark.parametrize("case", ["zeros", "tiny", "huge", "mixed", "dominant", "max"])
@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_adversarial(case, n):
    rng = np.random.default_rng(n)
    base = rng.standard_normal((n, 1000)).astype(np.float32)
    xs = {"zeros": np.zeros_like(base),
          "tiny": base * np.float32(1e-38),
          "huge": base * np.float32(1e37),
          "mixed": base * np.float32(10.0) ** rng.integers(-20, 20, base.shape).astype(np.float32),
          "dominant": np.vstack([base[:1] * 1e6, base[1:] * 1e-6]).astype(np.float32),
          "max": np.full_like(base, np.finfo(np.float32).max / n)}[case]
    check_bound(list(xs), 64)


def test_exponents():
    x = np.array([0, 0, 1.0, -3.0, 0.25, np.nan, np.inf, 0], dtype=np.float32)
    assert list(chunk_exponents(x, 2)) == [EXP_ZERO, 2, EXP_NONFINITE, EXP_NONFINITE]
    assert 2.0 ** chunk_exponents(np.array([3.0], np.float32), 1)[0] > 3.0


def test_log2_workers_leaves_headroom():
    for n in range(1, 300):
        assert n * (2 ** (31 - log2_workers(n)) - 1) < 2**31
    assert error_bound(EXP_ZERO, 4) == 0.0
    assert error_bound(0, 8) == 8 * math.ldexp(1, 3 - 31)  # L = 3 for 8 workers


def test_an_exponent_below_the_data_clamps_instead_of_overflowing():
    """Only a forged result can agree on an exponent below a chunk's own peak: the values
    then saturate at the limit (NaN at 0), and nothing overflows the int32 conversion."""
    import numpy as np

    from dlcomm.wire.quant import quantize, value_limit

    x = np.array([1e30, -1e30, 3.0, np.nan], dtype=np.float32)
    q = quantize(x, 2, 4)
    limit = value_limit(4)
    assert q.tolist()[:2] == [limit, -limit] and q[3] == 0
