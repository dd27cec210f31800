"""Counted collectives on exact tensor slices over torch.distributed point-to-point (gloo).

Every byte a partitioned layer moves goes through two functions here, so the count is the
algorithm's, on the sending side, element by element (4 bytes each in float32, 8 in
float64):

- :func:`redistribute` changes a (B x C ...) tensor's layout (layouts.Layout with integer
  bounds per rank). Rank r needs region ``N_r`` of the global tensor and owns ``O_r``; for
  every other rank k it sends ``N_k cap O_r`` (one rectangle, skipped when empty) and
  receives ``N_r cap O_k``. A FULL source moves nothing: every rank slices its own copy.
- :func:`allreduce` sums a tensor every rank holds in full: reduce-scatter (rank k owns
  slice k of an equal integer split of the flattened tensor; every rank sends each owner its
  slice, the owner adds the p contributions in rank order), then all-gather of the owned
  slices. Each rank sends ``(n - o_r) + (p-1) o_r`` elements, ``n`` for two ranks.

Messages go as ``isend``/``irecv`` with one tag per collective call; all ranks call the
collectives in the same order (SPMD), so the tags match.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dlcomm.plan.partition.layouts import Layout, integer_split

__all__ = ["Comm", "Region", "region"]

Region = tuple[tuple[int, int], tuple[int, int]]  # (rows lo, hi), (cols lo, hi)


def region(layout: Layout, bounds: tuple[int, ...] | None, k: int, rows: int,
           cols: int) -> Region:
    """The rows x cols rectangle rank ``k`` holds in ``layout``."""
    if layout == Layout.FULL:
        return (0, rows), (0, cols)
    assert bounds is not None
    part = (bounds[k], bounds[k + 1])
    return (part, (0, cols)) if layout == Layout.ROWS else ((0, rows), part)


def _cut(a: Region, b: Region) -> Region | None:
    rows = (max(a[0][0], b[0][0]), min(a[0][1], b[0][1]))
    cols = (max(a[1][0], b[1][0]), min(a[1][1], b[1][1]))
    if rows[0] >= rows[1] or cols[0] >= cols[1]:
        return None
    return rows, cols


def _index(piece: Region, origin: Region) -> tuple[slice, slice]:
    return (slice(piece[0][0] - origin[0][0], piece[0][1] - origin[0][0]),
            slice(piece[1][0] - origin[1][0], piece[1][1] - origin[1][0]))


@dataclass
class Comm:
    """One rank's view: who it is, and what it has sent and received, per key."""

    rank: int
    world: int
    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))      # elements
    received: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # elements
    seconds: float = 0.0
    calls: int = 0

    def _exchange(self, sends: list[tuple[int, torch.Tensor]],
                  recvs: list[tuple[int, torch.Tensor]]) -> None:
        tag = self.calls
        self.calls += 1
        requests = [dist.irecv(buf, src=peer, tag=tag) for peer, buf in recvs]
        requests += [dist.isend(t, dst=peer, tag=tag) for peer, t in sends]
        for request in requests:
            request.wait()

    def redistribute(self, local: torch.Tensor, src: Layout, src_bounds: tuple[int, ...] | None,
                     dst: Layout, dst_bounds: tuple[int, ...] | None, rows: int, cols: int,
                     key: str) -> torch.Tensor:
        """This rank's part of the tensor in the ``dst`` layout (module docstring)."""
        start = time.perf_counter()
        r = self.rank
        need = region(dst, dst_bounds, r, rows, cols)
        own = region(src, src_bounds, r, rows, cols)
        shape = (need[0][1] - need[0][0], need[1][1] - need[1][0], *local.shape[2:])
        if src == Layout.FULL:
            return local[_index(need, own)]
        out = local.new_empty(shape)
        sends, recvs, places = [], [], []
        for k in range(self.world):
            if k == r:
                piece = _cut(need, own)
                if piece is not None:
                    out[_index(piece, need)] = local[_index(piece, own)]
                continue
            incoming = _cut(need, region(src, src_bounds, k, rows, cols))
            if incoming is not None:
                buf = local.new_empty((incoming[0][1] - incoming[0][0],
                                       incoming[1][1] - incoming[1][0], *local.shape[2:]))
                recvs.append((k, buf))
                places.append((incoming, buf))
            outgoing = _cut(region(dst, dst_bounds, k, rows, cols), own)
            if outgoing is not None:
                sends.append((k, local[_index(outgoing, own)].contiguous()))
        self._exchange(sends, recvs)
        for piece, buf in places:
            out[_index(piece, need)] = buf
        self.sent[key] += sum(t.numel() for _, t in sends)
        self.received[key] += sum(b.numel() for _, b in recvs)
        self.seconds += time.perf_counter() - start
        return out

    def allreduce(self, full: torch.Tensor, key: str) -> torch.Tensor:
        """The element-wise sum over ranks of ``full`` (module docstring)."""
        start = time.perf_counter()
        r, p = self.rank, self.world
        flat = full.detach().reshape(-1).contiguous()
        sizes = integer_split(flat.numel(), [1.0] * p)
        edges = [sum(sizes[:k]) for k in range(p + 1)]
        mine = slice(edges[r], edges[r + 1])
        scatter_out = [(k, flat[edges[k]:edges[k + 1]].clone()) for k in range(p)
                       if k != r and sizes[k]]
        scatter_in = [(k, flat.new_empty(sizes[r])) for k in range(p) if k != r and sizes[r]]
        self._exchange(scatter_out, scatter_in)
        contributions = dict(scatter_in)
        reduced = flat.new_zeros(sizes[r])
        for k in range(p):
            reduced += flat[mine] if k == r else contributions.get(k, reduced[:0])
        gather_out = [(k, reduced) for k in range(p) if k != r and sizes[r]]
        gather_in = [(k, flat.new_empty(sizes[k])) for k in range(p) if k != r and sizes[k]]
        self._exchange(gather_out, gather_in)
        gathered = dict(gather_in)
        out = torch.cat([reduced if k == r else gathered.get(k, reduced[:0]) for k in range(p)])
        self.sent[key] += sum(t.numel() for _, t in scatter_out + gather_out)
        self.received[key] += sum(t.numel() for _, t in scatter_in + gather_in)
        self.seconds += time.perf_counter() - start
        return out.reshape(full.shape)
