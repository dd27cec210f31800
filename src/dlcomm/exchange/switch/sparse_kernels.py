"""The hot loops of a worker's sparse rounds, behind one interface with two implementations.

``scan`` finds a tensor's present blocks and their peaks in one pass; ``quantize`` gathers
the present blocks of the groups a round carries and quantizes them,
each group with its agreed exponent; ``dequantize`` writes a result's summed blocks into
the output. :data:`PYTHON` is the reference (wire/quant.py's rows); :data:`NATIVE` runs the
same loops in C (csrc/client.c, the GIL released), tested against it bit for bit. The
protocol around them (:mod:`.sparse_window`) is the same either way.
"""

from __future__ import annotations

import ctypes as C
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np

from dlcomm.wire.quant import dequantize_rows, quantize_rows
from dlcomm.wire.sparse import block_peaks, present_blocks

__all__ = ["SparseKernels", "PYTHON", "native_kernels", "gather_blocks", "peaks_of_present"]


class _Scan(Protocol):
    def __call__(self, x: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


class _Quantize(Protocol):
    def __call__(self, x: np.ndarray, b: int, m: int, groups: np.ndarray,
                 group_mask: np.ndarray, exps: np.ndarray, workers: int) -> np.ndarray: ...


class _Dequantize(Protocol):
    def __call__(self, out: np.ndarray, b: int, m: int, groups: np.ndarray, mask: np.ndarray,
                 values: np.ndarray, exps: np.ndarray, workers: int) -> None: ...


@dataclass(frozen=True)
class SparseKernels:
    """``scan(x, b)``: per block of ``b`` float32, (holds a value other than +-0, NaN
    included; holds only +-0 with a -0.0; max |x|, 0 where absent, NaN if it holds one);
    ``quantize(x, b, m, groups, group_mask, exps, workers)``: int32 (blocks, b), the
    present blocks (``group_mask``: per group of the tensor, its m blocks) of ``groups``
    in order, group ``groups[i]`` under exponent ``exps[i]``;
    ``dequantize(out, b, m, groups, mask, values, exps, workers)``: the rows ``values``
    of a result's blocks (``mask``: per listed group) into ``out``."""

    name: str
    scan: _Scan
    quantize: _Quantize
    dequantize: _Dequantize


def gather_blocks(x: np.ndarray, b: int, blocks: np.ndarray) -> np.ndarray:
    """Rows of ``x`` for global block indices (the tensor's last block zero-padded)."""
    full = len(x) // b
    rows = x[: full * b].reshape(full, b)[np.minimum(blocks, max(full - 1, 0))] \
        if full else np.zeros((len(blocks), b), np.float32)
    partial = blocks >= full
    if partial.any():
        tail = np.zeros(b, np.float32)
        tail[: len(x) - full * b] = x[full * b:]
        rows[partial] = tail
    return rows


FEW_BLOCKS = 0.25  # below this density the peaks are taken of the present blocks only


def peaks_of_present(x: np.ndarray, b: int, present: np.ndarray) -> np.ndarray:
    """max |x| of the present blocks, 0 elsewhere: of the present ones only, or of all
    blocks when many are present."""
    where = np.flatnonzero(present)
    if len(where) < FEW_BLOCKS * len(present):
        peaks = np.zeros(len(present), np.float32)
        peaks[where] = block_peaks(x, b, where)
        return peaks
    return np.where(present, block_peaks(x, b), np.float32(0.0)).astype(np.float32)


def _scan(x: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    present, negative_zero = present_blocks(x, b)
    return present, negative_zero, peaks_of_present(x, b, present)


def _quantize(x: np.ndarray, b: int, m: int, groups: np.ndarray, group_mask: np.ndarray,
              exps: np.ndarray, workers: int) -> np.ndarray:
    masks = group_mask[groups]
    blocks = (groups[:, None] * m + np.arange(m))[masks]
    if not len(blocks):
        return np.zeros((0, b), np.int32)
    return quantize_rows(gather_blocks(x, b, blocks), np.repeat(exps, masks.sum(axis=1)),
                         workers)


def _dequantize(out: np.ndarray, b: int, m: int, groups: np.ndarray, mask: np.ndarray,
                values: np.ndarray, exps: np.ndarray, workers: int) -> None:
    segment, block = np.nonzero(mask)
    blocks = groups[segment] * m + block
    rows = dequantize_rows(values, exps[segment], workers)
    full = len(out) // b
    inside = blocks < full
    out[: full * b].reshape(full, b)[blocks[inside]] = rows[inside]
    if not inside.all():  # the tensor's partial last block
        out[full * b:] = rows[~inside][0, : len(out) - full * b]


PYTHON = SparseKernels("python", _scan, _quantize, _dequantize)


def _ptr(a: np.ndarray) -> int:
    address: int = a.__array_interface__["data"][0]   # several times cheaper than .ctypes
    return address


@lru_cache(maxsize=1)
def native_kernels() -> SparseKernels:
    """The C loops; :class:`~dlcomm.native.lib.NativeMissing` if the library is not built."""
    from dlcomm.native.lib import load

    lib = load()
    scan_, quant, dequant = lib.dlc_sparse_scan, lib.dlc_sparse_quantize, lib.dlc_sparse_dequantize
    scan_.restype = None
    scan_.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_void_p, C.c_void_p, C.c_void_p]
    quant.restype, dequant.restype = C.c_long, None
    quant.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_void_p, C.c_int,
                      C.c_void_p, C.c_void_p, C.c_int, C.c_void_p]
    dequant.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_void_p, C.c_int,
                        C.c_void_p, C.c_void_p, C.c_void_p, C.c_int]

    def scan(x: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        blocks = -(-len(x) // b)
        present, negative_zero = np.empty(blocks, bool), np.empty(blocks, bool)
        peaks = np.empty(blocks, np.float32)
        if blocks:
            scan_(_ptr(x), len(x), b, _ptr(present), _ptr(negative_zero), _ptr(peaks))
        return present, negative_zero, peaks

    def quantize(x: np.ndarray, b: int, m: int, groups: np.ndarray, group_mask: np.ndarray,
                 exps: np.ndarray, workers: int) -> np.ndarray:
        groups = np.ascontiguousarray(groups, np.int64)
        exps = np.ascontiguousarray(exps, np.int64)
        mask = np.ascontiguousarray(group_mask, bool)
        q = np.empty((len(groups) * m, b), np.int32)   # room for every block of the groups
        rows = quant(_ptr(x), len(x), b, m, _ptr(groups), len(groups), _ptr(mask),
                     _ptr(exps), workers, _ptr(q)) if len(groups) else 0
        return q[:rows]

    def dequantize(out: np.ndarray, b: int, m: int, groups: np.ndarray, mask: np.ndarray,
                   values: np.ndarray, exps: np.ndarray, workers: int) -> None:
        groups = np.ascontiguousarray(groups, np.int64)
        exps = np.ascontiguousarray(exps, np.int64)
        mask = np.ascontiguousarray(mask, bool)
        values = np.ascontiguousarray(values, np.int32)
        dequant(_ptr(out), len(out), b, m, _ptr(groups), len(groups), _ptr(mask),
                _ptr(values), _ptr(exps), workers)

    return SparseKernels("native", scan, quantize, dequantize)
