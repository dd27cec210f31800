"""``powersgd``: PowerSGD (Vogels et al., NeurIPS'19, Algorithm 1): rank-r approximation by
one step of subspace iteration per training step, with warm start and error feedback.

For every parameter M of a bucket, viewed as a matrix (shape[0], rest) of n x m:

1. it is compressed only if (n + m) r * min_rate < n m (biases and small tensors are not:
   they are summed uncompressed, as torch's ``powerSGD_hook`` does);
2. Q (m x r): the previous step's Q (warm start), else standard normal draws from a seed
   taken from a NumPy RandomState(seed) once per bucket; Q is orthogonalized;
3. P = M Q; round 1 sums P over workers (together with the uncompressed tensors);
4. P is orthogonalized (Gram-Schmidt for r <= 2, else QR); Q = M^T P;
5. round 2 sums Q; Q_avg = Q_sum / n; the average of M over workers is ~ P Q_avg^T;
6. the ``powersgd`` memory keeps e = M_local - P Q_avg^T (and, for the uncompressed tensors,
   local minus average) and adds it to the next step's gradient.

The first ``start`` iterations run uncompressed without error feedback (torch's
``start_powerSGD_iter``; at least 2 because DDP rebuilds its buckets after iteration 1).
Both rounds carry float32 factors, so they sum on any exchange: (n + m) r floats per matrix.

Tensor shapes come from the DDP bucket (``dlcomm.torch`` passes ``bucket.gradients()``);
without them the whole flat bucket is viewed as one square matrix, zero-padded, as torch's
``batched_powerSGD_hook`` does; the padded matrix is kept per bucket, P Q^T is written over
it and scaled to the sum in place (the outcome's total is valid until the next call for
that bucket). The order of matrices, the random draws and the two
orthogonalizations follow torch 2.x, so results match its hook (tests/compress).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dlcomm.compress.base import COMPRESSORS, Compressor, Outcome, Payload, Protocol, Round
from dlcomm.errors import ConfigError
from dlcomm.registry import reject_unknown, take_option

__all__ = ["PowerSGD", "orthogonalize", "Layout", "plan_layout"]


def orthogonalize(matrix: torch.Tensor, eps: float = 0.0) -> None:
    """Make the columns of ``matrix`` (rows x r) orthonormal, in place.

    r <= 2: classical Gram-Schmidt, normalizing each column (by its norm + eps) and removing
    its component from the later columns; r > 2: the Q factor of a reduced QR decomposition.
    """
    rank = matrix.shape[1]
    if rank > 2:
        matrix.copy_(torch.linalg.qr(matrix).Q)
        return
    for i in range(rank):
        col = matrix[:, i:i + 1]
        norm = torch.norm(col, dim=0, keepdim=True)
        col /= norm + eps if eps else norm
        if i + 1 < rank:
            rest = matrix[:, i + 1:]
            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col


@dataclass(frozen=True)
class Block:
    offset: int      # first element in the flat tensor
    numel: int
    rows: int        # n (shape[0])
    cols: int        # m (the rest)
    rank: int        # 0: sent uncompressed


@dataclass(frozen=True)
class Layout:
    """How a flat bucket splits into matrices (compressed ones in torch's shape-group order)."""

    numel: int
    compressed: tuple[Block, ...]
    plain: tuple[Block, ...]
    square: bool = False  # the flat fallback: one zero-padded square matrix

    @property
    def p_size(self) -> int:
        return sum(b.rows * b.rank for b in self.compressed)

    @property
    def q_size(self) -> int:
        return sum(b.cols * b.rank for b in self.compressed)

    @property
    def plain_size(self) -> int:
        return sum(b.numel for b in self.plain)


def plan_layout(numel: int, shapes: list[torch.Size] | None, rank: int,
                min_rate: float) -> Layout:
    """Split ``numel`` elements by ``shapes`` (or one square) into compressed/plain blocks."""
    if not shapes:
        side = max(1, math.isqrt(numel - 1) + 1) if numel > 1 else 1
        r = min(side, rank)
        if (2 * side) * r * min_rate < side * side:
            return Layout(numel, (Block(0, numel, side, side, r),), (), square=True)
        return Layout(numel, (), (Block(0, numel, numel, 1, 0),), square=True)
    groups: dict[tuple[int, int], list[Block]] = {}
    plain = []
    offset = 0
    for shape in shapes:
        size = math.prod(shape)
        rows = shape[0] if len(shape) else 1
        cols = size // rows if rows else 0
        r = min(rows, cols, rank)
        if (rows + cols) * r * min_rate < rows * cols:
            groups.setdefault((rows, cols), []).append(Block(offset, size, rows, cols, r))
        else:
            plain.append(Block(offset, size, rows, cols, 0))
        offset += size
    if offset != numel:
        raise ValueError(f"bucket shapes hold {offset} elements, the bucket {numel}")
    return Layout(numel, tuple(b for g in groups.values() for b in g), tuple(plain))


class PowerSGD(Compressor):
    name = "powersgd"
    summable = True

    def __init__(self, rank: int = 1, start: int = 2, min_rate: float = 2.0, warm: bool = True,
                 seed: int = 0, eps: float = 0.0) -> None:
        self.rank, self.min_rate, self.warm, self.eps = rank, min_rate, warm, eps
        self.warmup_iterations = start
        self.rng = np.random.RandomState(seed)
        self.q_memory: dict[str, torch.Tensor] = {}
        self.pads: dict[str, torch.Tensor] = {}  # the flat fallback's padded square matrices
        self.numel_before = 0
        self.numel_after = 0

    # -- the two rounds ---------------------------------------------------------------------

    def _matrices(self, tensor: torch.Tensor, name: str, layout: Layout) -> list[torch.Tensor]:
        if layout.square and layout.compressed:
            b = layout.compressed[0]
            padded = self.pads.get(name)
            if padded is None or padded.numel() != b.rows * b.cols:
                # kept per bucket: a fresh one each step would cost a large bucket more in
                # page faults (the kernel zeroing its pages) than the products themselves
                padded = self.pads[name] = torch.empty(b.rows * b.cols)
            padded[:layout.numel] = tensor
            padded[layout.numel:].zero_()
            return [padded.view(b.rows, b.cols)]
        return [tensor[b.offset:b.offset + b.numel].view(b.rows, b.cols)
                for b in layout.compressed]

    def _initial_q(self, name: str, layout: Layout) -> list[torch.Tensor]:
        """Step 2: views of the Q memory, warm or freshly drawn, orthogonalized."""
        kept = self.q_memory.get(name) if self.warm else None
        fresh = kept is None or kept.numel() != layout.q_size
        q_flat = torch.empty(layout.q_size) if fresh or kept is None else kept
        qs, at = [], 0
        for b in layout.compressed:
            qs.append(q_flat[at:at + b.cols * b.rank].view(b.cols, b.rank))
            at += b.cols * b.rank
        if fresh:
            gen = torch.Generator().manual_seed(int(self.rng.randint(1_000_000_000)))
            for q in qs:
                q.copy_(torch.randn(1, *q.shape, generator=gen)[0])
        for q in qs:
            orthogonalize(q, self.eps)
        return qs

    def rounds(self, tensor: torch.Tensor, name: str, world: int,
               shapes: list[torch.Size] | None = None) -> Protocol:
        layout = plan_layout(tensor.numel(), shapes, self.rank, self.min_rate)
        self.numel_before += layout.numel
        self.numel_after += layout.plain_size + layout.p_size + layout.q_size
        mats = self._matrices(tensor, name, layout)
        qs = self._initial_q(name, layout)
        plain = (torch.cat([tensor[b.offset:b.offset + b.numel] for b in layout.plain])
                 if layout.plain else torch.zeros(0))
        p_flat = torch.cat([(m @ q).reshape(-1) for m, q in zip(mats, qs)]) if mats \
            else torch.zeros(0)
        plain_sum, p_sum = yield Round([plain, p_flat])               # step 3
        ps, at = [], 0
        for b in layout.compressed:
            ps.append(p_sum[at:at + b.rows * b.rank].view(b.rows, b.rank))
            at += b.rows * b.rank
        for p in ps:
            orthogonalize(p, self.eps)                                # step 4
        q_flat = torch.cat([(m.t() @ p).reshape(-1) for m, p in zip(mats, ps)]) if mats \
            else torch.zeros(0)
        (q_sum,) = yield Round([q_flat])                              # step 5
        q_avg = q_sum.div_(world)
        if self.warm:
            self.q_memory[name] = q_avg
        # the padded copy is not needed once Q is computed: P Q^T is written over it
        into = mats[0] if layout.square and mats else None
        average = self._assemble(layout, plain_sum.div_(world), ps, q_avg, into)
        info = {"p": layout.p_size, "q": layout.q_size, "plain": layout.plain_size}
        if into is not None:  # the padded matrix: the sum in place (valid until the next
            # call for this bucket; the exchange copies it into the bucket at once)
            return Outcome(average.mul_(world), info=info)
        return Outcome(average * world, average=average, info=info)

    def _assemble(self, layout: Layout, plain: torch.Tensor, ps: list[torch.Tensor],
                  q_flat: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """The flat tensor P Q^T (and the plain part) stand for. Each product is written
        where it belongs, into ``into`` (the square's padded matrix) if given: no
        temporaries of a bucket's size, whose fresh pages cost a large bucket more than
        the products (the kernel zeroes each page on its first touch)."""
        if layout.square and layout.compressed:
            b = layout.compressed[0]
            q = q_flat[:b.cols * b.rank].view(b.cols, b.rank)
            full = into if into is not None else torch.empty(b.rows, b.cols)
            torch.mm(ps[0], q.t(), out=full)
            return full.view(-1)[:layout.numel]
        out = torch.empty(layout.numel)
        at = 0
        for b in layout.plain:
            out[b.offset:b.offset + b.numel] = plain[at:at + b.numel]
            at += b.numel
        at = 0
        for b, p in zip(layout.compressed, ps):
            q = q_flat[at:at + b.cols * b.rank].view(b.cols, b.rank)
            at += b.cols * b.rank
            torch.mm(p, q.t(), out=out[b.offset:b.offset + b.numel].view(b.rows, b.cols))
        return out

    # -- GRACE's interface: one worker's factors --------------------------------------------

    def compress(self, tensor: torch.Tensor, name: str) -> tuple[Payload, Any]:
        """This worker alone (world of one, flat layout): payload = [uncompressed part,
        orthogonalized P, Q], the same steps as :meth:`rounds`."""
        protocol = self.rounds(tensor, name, 1)
        first = [t.clone() for t in next(protocol).tensors]
        second = [t.clone() for t in protocol.send(first).tensors]  # P orthogonalized in place
        try:
            protocol.send(second)
        except StopIteration:
            pass
        return [first[0], first[1], second[0]], plan_layout(tensor.numel(), None, self.rank,
                                                            self.min_rate)

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        plain, p_flat, q_flat = payload
        layout: Layout = ctx
        ps, at = [], 0
        for b in layout.compressed:
            ps.append(p_flat[at:at + b.rows * b.rank].view(b.rows, b.rank))
            at += b.rows * b.rank
        return self._assemble(layout, plain, ps, q_flat)

    def reset(self) -> None:
        self.q_memory.clear()
        self.pads.clear()

    def describe(self) -> dict[str, Any]:
        rate = self.numel_before / self.numel_after if self.numel_after else None
        return {**super().describe(), "rank": self.rank, "start": self.warmup_iterations,
                "compression_rate": rate}


@COMPRESSORS.register("powersgd", "PowerSGD rank-r factors, warm start (rank=1, start=2, "
                      "min_rate=2, warm=1, seed=0); summable")
def _make(**options: str) -> Compressor:
    owner = "compressor 'powersgd'"
    rank = take_option(options, "rank", int, 1, owner, lambda v: v >= 1, "rank >= 1")
    start = take_option(options, "start", int, 2, owner, lambda v: v >= 0, "start >= 0")
    min_rate = take_option(options, "min_rate", float, 2.0, owner, lambda v: v > 0, "min_rate > 0")
    warm = take_option(options, "warm", int, 1, owner, lambda v: v in (0, 1), "0 or 1")
    seed = take_option(options, "seed", int, 0, owner)
    eps = take_option(options, "eps", float, 0.0, owner, lambda v: v >= 0, "eps >= 0")
    reject_unknown(options, owner)
    if warm and start < 2:
        raise ConfigError(f"{owner}: start must be >= 2 with warm start (DDP rebuilds its "
                          "buckets after the first iteration), got start={start}")
    return PowerSGD(rank, start, min_rate, bool(warm), seed, eps)
