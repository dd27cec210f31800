"""Wire encodings of compressed payloads: integer lanes that can be summed, and sign bits.

**Summable integer lanes.** A quantizer sends integers q in [-m, m]. Shifted to q + m in
[0, 2m], the sum over n workers lies in [0, 2mn] and needs ``b = bit_length(2mn)`` bits. Put
L such lanes side by side in one wire word (lane j at bit j*b); adding words adds every lane
without carries crossing lanes, so an all-reduce of words sums all lanes at once:

    word = sum_j (q_j + m) << (j*b)   ->   sum over workers, then lane j = (word >> j*b) & (2^b-1)
    sum of q_j = lane_j - n*m

Word formats: ``int32`` (torch.distributed sums int32; 31 value bits, the sign bit is never
set) and ``float32`` holding an integer below 2^24 (the aggregation switch sums float32 in
int32 fixed point; every integer < 2^24 and the sum survive its quantization exactly because
its scale 2^(31-L-e) is >= 1 for such values, see wire/quant.py, and the dequantized sum is
below 2^24 so the final rounding to float32 is exact). Example, 8-bit levels (m = 127) on 4
workers: b = 10, three lanes per int32 word (1.33 bytes per value), two per float32 word.

**Sign bits** (not summable): 8 signs per byte, numpy's packbits.
"""

from __future__ import annotations

import numpy as np
import torch

from dlcomm.compress.base import Compressor, Payload
from dlcomm.errors import ConfigError

__all__ = ["check_world", "lane_bits", "lanes_per_word", "pack_lanes", "unpack_lane_sums",
           "pack_signs", "unpack_signs", "WORD_BITS", "encode_payload", "decode_payload"]

WORD_BITS = {torch.int32: 31, torch.float32: 24}  # value bits a summed word may use
_SIGN_OF_BIT = np.array([-1.0, 1.0], dtype=np.float32)


def lane_bits(levels: int, world: int) -> int:
    """Bits of one lane holding the sum over ``world`` workers of values in [-levels, levels]."""
    return max(1, (2 * levels * world).bit_length())


def lanes_per_word(levels: int, world: int, word: torch.dtype) -> int:
    """How many lanes fit in one summed word of ``word`` dtype (at least 1, else an error)."""
    lanes = WORD_BITS[word] // lane_bits(levels, world)
    if lanes < 1:
        raise ConfigError(f"integer levels {levels} on {world} workers need "
                          f"{lane_bits(levels, world)} bits, more than a {word} word holds")
    return lanes


def pack_lanes(values: torch.Tensor, levels: int, world: int, word: torch.dtype) -> torch.Tensor:
    """Integers in [-levels, levels] (1-D) -> words of ``word`` dtype, ready to be summed."""
    bits = lane_bits(levels, world)
    lanes = lanes_per_word(levels, world, word)
    n = values.numel()
    rows = -(-n // lanes)
    shifted = torch.zeros(rows * lanes, dtype=torch.int64)  # padding lanes stay 0
    shifted[:n] = values.to(torch.int64) + levels
    shifted = shifted.view(rows, lanes)                           # (words, lanes)
    shifts = torch.arange(lanes, dtype=torch.int64) * bits        # (lanes,)
    words = (shifted << shifts).sum(dim=1)                        # disjoint bits: sum == or
    return words.to(word)


def unpack_lane_sums(words: torch.Tensor, count: int, levels: int, world: int) -> torch.Tensor:
    """Summed words -> the ``count`` summed integers (int64), undoing the +levels shift."""
    word = words.dtype
    bits = lane_bits(levels, world)
    lanes = lanes_per_word(levels, world, word)
    w = words.to(torch.int64).view(-1, 1)                          # exact: < 2^31
    shifts = torch.arange(lanes, dtype=torch.int64) * bits
    lane_sums = (w >> shifts) & ((1 << bits) - 1)                 # (words, lanes)
    return lane_sums.reshape(-1)[:count] - levels * world


def pack_signs(tensor: torch.Tensor) -> torch.Tensor:
    """1 bit per element (1: >= 0), as uint8; ceil(n/8) bytes."""
    bits = (tensor >= 0).numpy()
    return torch.from_numpy(np.packbits(bits))


def unpack_signs(packed: torch.Tensor, count: int) -> torch.Tensor:
    """The +1/-1 float32 signs of :func:`pack_signs`."""
    bits = np.unpackbits(packed.numpy(), count=count)
    return torch.from_numpy(_SIGN_OF_BIT[bits])


def encode_payload(payload: Payload) -> torch.Tensor:
    """The payload as one uint8 tensor: int64 counts, then every tensor's raw bytes."""
    header = torch.tensor([t.numel() for t in payload], dtype=torch.int64)
    parts = [header.view(torch.uint8)]
    for t in payload:
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        parts.append(raw)
        if raw.numel() % 8:
            parts.append(torch.zeros(8 - raw.numel() % 8, dtype=torch.uint8))
    return torch.cat(parts)


def decode_payload(buf: torch.Tensor, like: Payload) -> Payload:
    """Inverse of :func:`encode_payload`; ``like`` gives the dtypes (a local payload)."""
    count = len(like)
    header = buf[:8 * count].view(torch.int64)
    out, at = [], 8 * count
    for t, numel in zip(like, header.tolist()):
        nbytes = int(numel) * t.element_size()
        out.append(buf[at:at + nbytes].view(t.dtype))
        at += -(-nbytes // 8) * 8
    return out


def check_world(compressor: Compressor, world: int, word: torch.dtype) -> None:
    """ConfigError if the compressor's integer levels cannot be summed over ``world``."""
    levels = compressor.payload_levels()
    if compressor.summable and levels is not None:
        try:
            lanes_per_word(levels, world, word)
        except ConfigError as exc:
            raise ConfigError(f"compressor {compressor.name!r}: {exc}") from None
