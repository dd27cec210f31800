"""All-gather of variable-size payloads without padding (for non-summable compressors).

torch.distributed's gloo all-gather wants equal sizes, so padding every payload to the
largest one (what GRACE's allgather does) sends max/mean times the bytes needed. Instead:

1. the payload tensors are laid out as raw bytes
   (:func:`dlcomm.compress.packing.encode_payload`: int64 element counts, then each
   tensor's bytes padded to a multiple of 8, so that every tensor can be viewed in place);
2. the workers all-gather their byte counts (one int64 each);
3. one ``all_to_all_single`` moves exactly each worker's bytes to every other worker
   (input: my bytes once per peer; output: the peers' bytes back to back).

Bytes a worker sends: (n - 1) x its payload; receives: the sum of the peers' payloads --
the same as a ring all-gather of exact sizes. Methods whose payload size depends only on the
tensor's (top-k, sign bits, natural) skip step 2 and use one plain all-gather.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

__all__ = ["allgather_bytes", "GatherCount"]


class GatherCount:
    """Bytes moved by :func:`allgather_bytes` (this worker's view)."""

    def __init__(self) -> None:
        self.data_sent = self.data_received = self.control_bytes = 0
        self.sizes_s = 0.0  # seconds of the last size exchange (a latency sample)


def allgather_bytes(buf: torch.Tensor, rank: int, world: int,
                    group: dist.ProcessGroup | None, count: GatherCount,
                    same_size: bool = False) -> list[torch.Tensor]:
    """Every worker's ``buf`` (uint8, any length), in rank order; no padding.

    ``same_size``: every worker's payload is known to have this length (top-k's k, sign
    bits), so step 2 is skipped and one plain all-gather moves the bytes.
    """
    if world == 1:
        return [buf]
    if same_size:
        pieces = [torch.empty_like(buf) for _ in range(world)]
        dist.all_gather(pieces, buf, group=group)
        count.sizes_s = 0.0
        count.data_sent += buf.numel() * (world - 1)
        count.data_received += buf.numel() * (world - 1)
        pieces[rank] = buf
        return pieces
    size = torch.tensor([buf.numel()], dtype=torch.int64)
    sizes_t = [torch.empty(1, dtype=torch.int64) for _ in range(world)]
    t0 = time.perf_counter()
    dist.all_gather(sizes_t, size, group=group)                       # step 2
    count.sizes_s = time.perf_counter() - t0
    sizes = [int(s[0]) for s in sizes_t]
    count.control_bytes += 8 * (world - 1)
    send_splits = [0 if r == rank else buf.numel() for r in range(world)]
    recv_splits = [0 if r == rank else sizes[r] for r in range(world)]
    out = torch.empty(sum(recv_splits), dtype=torch.uint8)
    dist.all_to_all_single(out, buf.repeat(world - 1), output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, group=group)  # step 3
    count.data_sent += buf.numel() * (world - 1)
    count.data_received += sum(recv_splits)
    pieces, at = [], 0
    for r in range(world):
        if r == rank:
            pieces.append(buf)
        else:
            pieces.append(out[at:at + sizes[r]])
            at += sizes[r]
    return pieces
