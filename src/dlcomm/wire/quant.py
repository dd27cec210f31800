"""Fixed-point quantization so that a switch that only adds int32 can sum float32 gradients.

SwitchML's scheme (docs/references.md: SwitchML), with a power-of-two scale:

1. each worker computes, per chunk, the exponent e with 2^e > max|x| (``frexp``); an
   all-zero chunk has :data:`EXP_ZERO`, a chunk with NaN/Inf :data:`EXP_NONFINITE`;
2. exponents travel one round ahead and the switch returns their maximum e_max, so every
   worker scales the chunk by the same f = 2^s, s = 31 - L - e_max, L = max(1, ceil(log2 n));
3. q = round(x * f), clamped to |q| <= 2^(31-L) - 1, so the sum of n values is at most
   n * (2^(31-L) - 1) < 2^31: the int32 sum can never overflow;
4. the sum is divided by f (exactly, in float64) and rounded once to float32.

Error bound: each worker's rounding error is at most 0.5/f and clamping changes a value by
at most 1/f (only when |x| is within 1/f of 2^e_max), so for the float64 sum
|dequantized - exact| <= n / f = n * 2^(e_max + L - 31), plus the final rounding to float32
(half an ulp of the result). Relative to the largest input magnitude (>= 2^(e_max-1)) that
is below 2n * 2^(L-31) ~ 1e-8 for n = 8. Power-of-two scales make step 2 exact and the
result independent of the order in which the switch adds, so a run with packet loss and
retransmissions is bit-identical to a lossless one.

Both directions run in float32 without loss: multiplying by a power of two is exact, a
float32 above 2^24 is already an integer, and rounding the int32 sum to float32 before the
power-of-two division equals rounding the exact quotient (no subnormals arise above 2^-126).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["EXP_ZERO", "EXP_NONFINITE", "EXP_MIN", "EXP_MAX", "valid_exponent",
           "chunk_exponents", "exponents_of_peaks", "quantize_rows", "dequantize_rows",
           "shift_for", "quantize", "dequantize_into", "error_bound", "log2_workers",
           "value_limit"]

EXP_ZERO = -32768      # the chunk is all zeros (or the exponent round has no chunk)
EXP_NONFINITE = 32767  # the chunk holds NaN or Inf
EXP_MIN, EXP_MAX = -148, 128  # frexp exponents of float32 peaks: subnormals .. max float


def valid_exponent(e: int) -> bool:
    """What a worker can announce: a float32 peak's exponent, or the two markers."""
    return EXP_MIN <= e <= EXP_MAX or e in (EXP_ZERO, EXP_NONFINITE)


def log2_workers(n: int) -> int:
    """L = max(1, ceil(log2 n)): the headroom bits that keep n summands inside int32."""
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1


def value_limit(n: int) -> int:
    """The largest |q| one of ``n`` workers may contribute: n of them never overflow int32."""
    return (1 << (31 - log2_workers(n))) - 1


def chunk_exponents(x: np.ndarray, k: int) -> np.ndarray:
    """Per chunk of ``k`` elements of float32 ``x``: e with 2^e > max|x| (int32 array)."""
    full, rest = divmod(len(x), k)
    view = x[: full * k].reshape(full, k)
    peaks = np.maximum(view.max(axis=1), -view.min(axis=1)) if full else np.zeros(0, np.float32)
    if rest:
        tail = x[full * k:]
        peaks = np.append(peaks, max(tail.max(), -tail.min()))
    return exponents_of_peaks(peaks)


def exponents_of_peaks(peaks: np.ndarray) -> np.ndarray:
    """e with 2^e > peak for each chunk peak (max |x|); zero and non-finite peaks marked."""
    _, exps = np.frexp(peaks.astype(np.float64))
    exps = exps.astype(np.int32)
    exps[peaks == 0] = EXP_ZERO
    exps[~np.isfinite(peaks)] = EXP_NONFINITE
    return exps


def shift_for(e_max: int, n: int) -> int:
    """s such that the scale is 2^s for the agreed exponent ``e_max`` among ``n`` workers."""
    return 31 - log2_workers(n) - e_max


def quantize(x: np.ndarray, e_max: int, n: int) -> np.ndarray:
    """int32 fixed-point values of float32 ``x`` under the agreed exponent ``e_max``."""
    if e_max == EXP_ZERO:
        return np.zeros(len(x), dtype=np.int32)
    limit = value_limit(n)
    v = np.ldexp(x, np.int32(shift_for(e_max, n)))  # exact; 2^s itself may exceed float32
    _bound(v, limit)
    np.rint(v, out=v)  # |v| <= 2^(31-L) <= 2^30: fits int32 before the clamp
    q: np.ndarray = v.astype(np.int32)
    np.minimum(q, limit, out=q)
    np.maximum(q, -limit, out=q)
    return q


def _bound(v: np.ndarray, limit: int) -> None:
    """Keep scaled values within +-2^(31-L) (exact in float32) and NaN at 0 before they are
    converted to int32: an agreed exponent below the chunk's own (a forged result; honest
    ones never are) would otherwise overflow the conversion."""
    cap = np.float32(limit + 1)
    np.clip(v, -cap, cap, out=v)
    np.nan_to_num(v, copy=False)


def dequantize_into(out: np.ndarray, total: np.ndarray, e_max: int, n: int) -> None:
    """Write the float32 value of the int32 sum ``total`` into ``out``."""
    if e_max == EXP_ZERO:
        out[:] = 0.0
        return
    out[:] = total  # int32 -> float32, rounded once
    with np.errstate(over="ignore"):  # a sum beyond float32 becomes +-inf, as in IEEE addition
        np.ldexp(out, np.int32(-shift_for(e_max, n)), out=out)


def error_bound(e_max: int, n: int) -> float:
    """Bound on |result - exact float64 sum| per element, before rounding to float32."""
    if e_max == EXP_ZERO:
        return 0.0
    return n * math.ldexp(1.0, e_max + log2_workers(n) - 31)


def quantize_rows(rows: np.ndarray, e_rows: np.ndarray, n: int) -> np.ndarray:
    """:func:`quantize` of every row of a 2-D float32 array with its own agreed exponent."""
    limit = value_limit(n)
    shifts = np.where(e_rows == EXP_ZERO, 0, 31 - log2_workers(n) - e_rows).astype(np.int32)
    v = np.ldexp(rows, shifts[:, None])
    _bound(v, limit)
    np.rint(v, out=v)
    q: np.ndarray = v.astype(np.int32)
    q[e_rows == EXP_ZERO] = 0
    np.minimum(q, limit, out=q)
    np.maximum(q, -limit, out=q)
    return q


def dequantize_rows(totals: np.ndarray, e_rows: np.ndarray, n: int) -> np.ndarray:
    """:func:`dequantize_into` of every row of a 2-D int32 array with its exponent."""
    out = totals.astype(np.float32)
    shifts = np.where(e_rows == EXP_ZERO, 0, e_rows + log2_workers(n) - 31).astype(np.int32)
    with np.errstate(over="ignore"):
        np.ldexp(out, shifts[:, None], out=out)
    out[e_rows == EXP_ZERO] = 0.0
    return out
