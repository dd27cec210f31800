"""Sparse block encoding for streaming aggregation (OmniReduce; docs/references.md).

A tensor is cut into blocks of b elements; m consecutive blocks form a *group*, which is
exactly a dense chunk (m x b = k), so a group is quantized with the same exponent in both
modes. A block is non-zero if any |x| > threshold (0: exact) or it holds a NaN.

A sparse round covers one or more groups (the switch picks them from the workers'
look-ahead), and its payloads are, as little-endian u32 words then int32 values::

    nseg    u32               groups carried
    nhead   u32               entries of the head table
    m       u32               blocks per group (every mask has m bits; 0 when nseg is 0)
    head    nhead x width u32 DATA (width 2 + ceil(m / 32)): the sender's next non-zero
                              groups after this round, as (group, exponent, block mask words);
                              RESULT (width 2): the next round's groups, as (group, agreed
                              exponent) - empty when the position is done
    groups  nseg u32          strictly increasing
    masks   nseg x ceil(m / 32) u32   bit i: block i of that group is present
    values  b int32 per present block, group after group, blocks in order (a partial last
            block of the tensor is zero-padded)

Everything of one kind lies together, so that one payload is decoded (and summed) with a
handful of array operations whatever its number of groups. The header's ``numel`` counts
all values.

A RESULT flagged RUN plans a *dense run*: every worker announced the listed groups, with
every block present. Those groups then follow as ordinary dense rounds (the cheap path of the
switch), exponents agreed one round ahead as in dense mode, after which the position
announces its look-ahead again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["Blocks", "Presence", "presence", "block_peaks", "present_blocks",
           "zero_absent_blocks", "encode", "decode", "mask_words", "data_width", "RESULT_WIDTH",
           "LOOKAHEAD", "signed32", "pack_masks", "unpack_masks", "popcount"]

RESULT_WIDTH = 2
LOOKAHEAD = 64  # next non-zero groups a worker announces per slot


def data_width(blocks_per_group: int) -> int:
    """Columns of a DATA look-ahead entry: group, exponent, then the group's mask words."""
    return 2 + mask_words(blocks_per_group)


def pack_masks(masks: np.ndarray) -> np.ndarray:
    """Bool rows (r, m) -> u32 words (r, ceil(m / 32)), bit i of a row = block i."""
    rows, m = masks.shape
    bits = np.zeros((rows, mask_words(m) * 32), dtype=bool)
    bits[:, :m] = masks
    return np.packbits(bits, axis=1, bitorder="little").view("<u4").astype(np.int64)


def unpack_masks(words: np.ndarray, m: int) -> np.ndarray:
    """u32 words (r, ceil(m / 32)) -> bool rows (r, m); ValueError if a bit lies beyond m."""
    raw = np.ascontiguousarray(words, dtype="<u4")
    bits = np.unpackbits(raw.view(np.uint8).reshape(raw.shape[0], 4 * raw.shape[1]), axis=1,
                         bitorder="little")
    if bits.shape[1] != mask_words(m) * 32 or bits[:, m:].any():
        raise ValueError(f"sparse mask has bits beyond its group's {m} blocks")
    return bits[:, :m].astype(bool)


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


def popcount(words: np.ndarray) -> np.ndarray:
    """Set bits per row of u32 words (rows, w)."""
    as_bytes = np.ascontiguousarray(words, dtype="<u4").view(np.uint8)
    counts: np.ndarray = _POPCOUNT[as_bytes].reshape(len(words), -1).sum(axis=1)
    return counts


@dataclass
class Blocks:
    """The groups of one sparse payload: ``mask[i, j]`` says block j of ``groups[i]`` is
    present, and ``values`` holds the present blocks' values as rows of b, in the order of
    ``np.nonzero(mask)``."""

    groups: np.ndarray   # int64 (n,)
    mask: np.ndarray     # bool (n, m)
    values: np.ndarray   # int32 (mask.sum(), b)

    @classmethod
    def empty(cls) -> Blocks:
        return cls(np.zeros(0, np.int64), np.zeros((0, 0), bool), np.zeros((0, 1), np.int32))


def signed32(values: np.ndarray) -> np.ndarray:
    """u32 words back to the signed ints they carry (exponents may be negative)."""
    return (values + 2**31) % 2**32 - 2**31


def mask_words(blocks: int) -> int:
    return (blocks + 31) // 32


def _per_block(x: np.ndarray, b: int, blocks: np.ndarray | None,
               rows: Callable[[torch.Tensor], np.ndarray], tail: Callable[[np.ndarray], Any],
               dtype: type) -> np.ndarray:
    """``rows`` applied to every block of ``b`` elements of ``x`` (or only to the sorted
    block indices ``blocks``, gathered), ``tail`` to a partial last block. torch's row
    reductions run several times faster than numpy's on short rows, on ``x``'s own memory."""
    import torch  # here, not at the top: the switch decodes this format without torch

    full, rest = divmod(len(x), b)
    view = torch.from_numpy(x[: full * b]).view(full, b)
    if blocks is None:
        out = rows(view) if full else np.zeros(0, dtype)
        return np.append(out, tail(x[full * b:])).astype(dtype) if rest else out
    inside = blocks[blocks < full]
    out = np.zeros(len(blocks), dtype)
    if len(inside):
        out[: len(inside)] = rows(view[torch.from_numpy(inside)])
    if len(inside) < len(blocks):  # the partial last block (sorted: the last index)
        out[-1] = tail(x[full * b:])
    return out


def block_peaks(x: np.ndarray, b: int, blocks: np.ndarray | None = None) -> np.ndarray:
    """max |x| per block of ``b`` elements (NaN if the block holds one), in two reductions
    without a temporary; of every block, or of the sorted block indices ``blocks``."""
    return _per_block(x, b, blocks,
                      lambda r: r.amax(dim=1).maximum(r.amin(dim=1).neg_()).numpy(),
                      lambda t: max(t.max(), -t.min()), np.float32)


_SIGN_BYTE = 0x80  # -0.0 is the bytes 00 00 00 80 (little-endian)


@dataclass(frozen=True)
class Presence:
    """Which blocks of ``block`` elements of a tensor hold data (:func:`presence`): found
    once per tensor and handed on, so that nobody reads the tensor for it a second time."""

    block: int
    present: np.ndarray        # per block: a value other than +-0 (NaN included)
    negative_zero: np.ndarray  # per block: only +-0, at least one -0.0

    @property
    def density(self) -> float:
        return float(self.present.mean()) if len(self.present) else 0.0


def presence(x: np.ndarray, b: int) -> Presence:
    """:func:`present_blocks` of ``x`` as a :class:`Presence`."""
    present, negative_zero = present_blocks(x, b)
    return Presence(b, present, negative_zero)


def present_blocks(x: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block of ``b`` float32 elements: (holds a value other than +-0, NaN included;
    holds only +-0 with at least one -0.0), from one reduction over ``x``'s own memory: the
    largest byte of each block. 0: every element is +0.0. Any other byte than 0x80, or a
    larger one, belongs to a float other than +-0 (-0.0 is the bytes 00 00 00 80). Exactly
    0x80: -0.0, or values whose bytes are all at most 0x80 (1.0 is 00 00 80 3F): those few
    blocks are looked at again."""
    import torch

    if x.dtype != np.float32:
        raise TypeError(f"present_blocks reads float32 bytes, got {x.dtype}")
    full, rest = divmod(len(x), b)
    if full:
        top = torch.from_numpy(x[: full * b].view(np.uint8)).view(full, 4 * b).amax(dim=1).numpy()
        present = (top != 0) & (top != _SIGN_BYTE)
        unsure = np.flatnonzero(top == _SIGN_BYTE)
        if len(unsure):  # a value is there iff the block's max |x| is not 0 (NaN is not)
            present[unsure] = block_peaks(x, b, unsure) != 0
        negative_zero = ~present & (top == _SIGN_BYTE)
    else:
        present = negative_zero = np.zeros(0, bool)
    if rest:
        tail = x[full * b:]
        here = bool(np.any(tail != 0) or np.isnan(tail).any())
        present = np.append(present, here)
        negative_zero = np.append(negative_zero, not here and bool(np.signbit(tail).any()))
    return present, negative_zero


def zero_absent_blocks(x: np.ndarray, present: np.ndarray, b: int) -> None:
    """Blocks that are not sent are dropped: make them exact (+0.0) zeros, in place."""
    full = len(x) // b
    absent = ~present[:full]
    if full and absent.mean() > 0.5:  # mostly absent: clear everything, put the present back
        keep = np.flatnonzero(present[:full])
        saved = x[: full * b].reshape(full, b)[keep]
        x[: full * b] = 0.0
        x[: full * b].reshape(full, b)[keep] = saved
    else:
        x[: full * b].reshape(full, b)[absent] = 0.0
    if len(present) > full and not present[full]:
        x[full * b:] = 0.0


_HEAD = struct.Struct("<III")


def encode(head: np.ndarray, blocks: Blocks) -> bytes:
    """A sparse payload (``head``: an (n, width) table of u32-representable ints)."""
    table = np.ascontiguousarray(head, dtype=np.int64).astype("<u4")
    n, m = blocks.mask.shape
    words = pack_masks(blocks.mask).astype("<u4") if n else np.zeros(0, "<u4")
    return b"".join((_HEAD.pack(n, len(table), m if n else 0), table.tobytes(),
                     np.asarray(blocks.groups, dtype="<u4").tobytes(), words.tobytes(),
                     np.ascontiguousarray(blocks.values, dtype="<i4").tobytes()))


def decode(payload: memoryview | bytes, numel: int, b: int, width: int
           ) -> tuple[np.ndarray, Blocks]:
    """(head table as int64 (n, width), blocks); ValueError if anything is inconsistent."""
    data = memoryview(payload)
    if len(data) < _HEAD.size:
        raise ValueError("sparse payload shorter than its header")
    nseg, nhead, m = _HEAD.unpack_from(data, 0)
    words = mask_words(m)
    offset = _HEAD.size + 4 * width * nhead
    end = offset + 4 * nseg * (1 + words)
    if end > len(data) or (nseg and not m):
        raise ValueError("sparse head table, groups or masks run past the payload")
    head = np.frombuffer(data, dtype="<u4", count=width * nhead, offset=_HEAD.size
                         ).astype(np.int64).reshape(nhead, width)
    groups = np.frombuffer(data, dtype="<u4", count=nseg, offset=offset).astype(np.int64)
    if nseg > 1 and not (groups[1:] > groups[:-1]).all():
        raise ValueError("sparse groups are not strictly increasing")
    raw = np.frombuffer(data, dtype="<u4", count=words * nseg, offset=offset + 4 * nseg)
    mask = unpack_masks(raw.reshape(nseg, words), m)
    present = int(np.count_nonzero(mask))
    if present * b != numel or len(data) - end != 4 * numel:
        raise ValueError(f"sparse payload of {len(data)} bytes holds {present} blocks; the "
                         f"header says {numel} values")
    values = np.frombuffer(data, dtype="<i4", count=numel, offset=end).reshape(present, b)
    return head, Blocks(groups, mask, values)
