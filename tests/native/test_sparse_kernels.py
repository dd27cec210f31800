"""The native loops of a worker's sparse rounds against their Python reference, bit for bit:
any float32 values (NaN, infinities, signed zeros, subnormals), any valid exponent (also
one below a block's own, which clamps), partial last blocks, empty selections."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.exchange.switch.sparse_kernels import PYTHON, native_kernels
from dlcomm.wire.quant import EXP_MAX, EXP_MIN, EXP_ZERO
from tests.native.twins import needs_native

pytestmark = needs_native

exponents = st.one_of(st.integers(EXP_MIN, EXP_MAX), st.just(EXP_ZERO), st.integers(-8, 8))
specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, -3e38, 2.0**24], np.float32)


def tensor(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 38, n)).astype(np.float32)
    x[rng.random(n) < 0.3] = 0.0
    pick = rng.random(n) < 0.05
    x[pick] = rng.choice(specials, int(pick.sum()))
    return x


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), b=st.sampled_from([1, 3, 8, 256]),
       m=st.integers(1, 40), chunks=st.integers(1, 6), cut=st.integers(0, 255),
       workers=st.integers(1, 64), data=st.data())
def test_quantize_matches_the_reference(seed, b, m, chunks, cut, workers, data):
    rng = np.random.default_rng(seed)
    n = max(0, chunks * m * b - cut % (m * b))
    blocks = -(-n // b)
    group_mask = np.zeros((chunks, m), bool)
    group_mask.reshape(-1)[:blocks] = rng.random(blocks) < 0.5
    groups = np.flatnonzero(rng.random(chunks) < 0.6).astype(np.int64)
    exps = np.array(data.draw(st.lists(exponents, min_size=len(groups),
                                       max_size=len(groups))), np.int64)
    x = tensor(rng, n)
    with np.errstate(all="ignore"):   # an exponent below a block's own overflows the scale
        want = PYTHON.quantize(x, b, m, groups, group_mask, exps, workers)
    got = native_kernels().quantize(x, b, m, groups, group_mask, exps, workers)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), b=st.sampled_from([1, 3, 8, 256]),
       m=st.integers(1, 40), chunks=st.integers(1, 6), cut=st.integers(0, 255),
       workers=st.integers(1, 64), data=st.data())
def test_dequantize_matches_the_reference(seed, b, m, chunks, cut, workers, data):
    rng = np.random.default_rng(seed)
    n = max(1, chunks * m * b - cut % (m * b))
    groups = np.flatnonzero(rng.random(chunks) < 0.6).astype(np.int64)
    mask = rng.random((len(groups), m)) < 0.5
    blocks = (groups[:, None] * m + np.arange(m))[mask]
    keep = blocks * b < n   # a result names blocks of the tensor only
    mask[mask] = keep
    values = rng.integers(-2**31, 2**31, (int(mask.sum()), b), dtype=np.int64).astype(np.int32)
    exps = np.array(data.draw(st.lists(exponents, min_size=len(groups),
                                       max_size=len(groups))), np.int64)
    want = tensor(rng, n)
    got = want.copy()
    PYTHON.dequantize(want, b, m, groups, mask, values, exps, workers)
    native_kernels().dequantize(got, b, m, groups, mask, values, exps, workers)
    assert got.tobytes() == want.tobytes()


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), b=st.sampled_from([1, 3, 8, 256]),
       n=st.integers(0, 3000), density=st.sampled_from([0.0, 0.05, 0.5, 1.0]))
def test_scan_matches_the_reference(seed, b, n, density):
    """Present blocks (NaN included), blocks of signed zeros, and peaks (NaN where a NaN
    is: the exponent marks it non-finite either way)."""
    rng = np.random.default_rng(seed)
    x = tensor(rng, n)
    blocks = -(-n // b)
    absent = np.repeat(rng.random(blocks) >= density, b)[:n]
    x[absent] = np.where(rng.random(int(absent.sum())) < 0.1, -0.0, 0.0)
    want = PYTHON.scan(x, b)
    got = native_kernels().scan(x, b)
    assert (got[0] == want[0]).all() and (got[1] == want[1]).all()
    assert np.array_equal(got[2], want[2], equal_nan=True)
