"""The worker's side of sparse streaming aggregation (OmniReduce), as a pure state machine.

The same window, timers, probes and retransmission as the dense :class:`AllreduceOp`; what
changes is what a round carries. Groups of m blocks of b elements are the dense chunks
(m x b = k), and window position p owns the groups g = p, p + P, p + 2P, ... Per position
(docs/references.md: OmniReduce):

1. an announce round (no values) tells the switch each worker's look-ahead: its next
   ``LOOKAHEAD`` groups that hold a non-zero block, each with its exponent and its count of
   non-zero blocks;
2. the switch plans the next round from all look-aheads (``switch.planning.plan_round``):
   the smallest announced groups, as many as fit one datagram, with the largest announced
   exponent per group; its result names them;
3. the workers that have data in those groups send their non-zero blocks of every one of
   them (quantized per group with the agreed exponent) and a new look-ahead; every other
   worker is implicitly zero there and sends an empty contribution (its look-ahead only),
   so that, as in dense mode, a slot never runs ahead of a worker that has not yet received
   its previous result (a worker that only listened could miss a result for good);
4. every result carries the sums of the round's groups (the union of the blocks announced
   in them) and the next round's plan; when nobody has anything left, the plan is empty and
   the position is done.

At low density one round fuses many groups; at full density a round is one group, as in
dense mode. Blocks at or below ``threshold`` are not sent and become zeros (0 = exact).
With threshold 0 the result is bit-identical to the dense exchange with the same k: every
group is quantized with the exponent a dense round would agree on (a listener's all-zero
group would not raise the maximum), and adding zeros changes no integer sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlcomm.errors import ExchangeError
from dlcomm.exchange.switch.sparse_kernels import PYTHON, SparseKernels, peaks_of_present
from dlcomm.exchange.switch.window import AllreduceOp, Send, _Position
from dlcomm.wire.packet import ANNOUNCE, DATA, HEADER_SIZE, MAX_DATAGRAM, RUN, SPARSE, Header
from dlcomm.wire.quant import (
    EXP_NONFINITE,
    EXP_ZERO,
    dequantize_into,
    exponents_of_peaks,
)
from dlcomm.wire.sparse import (
    LOOKAHEAD,
    RESULT_WIDTH,
    Blocks,
    Presence,
    block_peaks,
    data_width,
    decode,
    encode,
    pack_masks,
    signed32,
    zero_absent_blocks,
)

__all__ = ["SparseAllreduceOp"]


@dataclass
class SparseAllreduceOp(AllreduceOp):
    block: int = 256
    threshold: float = 0.0
    presence: Presence | None = None  # the data's present blocks, if the caller looked
    plans: dict[int, dict[int, int]] = field(default_factory=dict)  # position -> group -> exp
    runs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # dense runs left
    kernels: SparseKernels = PYTHON  # the hot loops: the reference, or the native ones

    def _prepare(self) -> np.ndarray:
        """Find the blocks to send and the chunk exponents (the hot pass over the data).

        Blocks above ``threshold`` travel (0 = every block with a value other than +-0;
        NaN blocks always, so that all workers see them). With threshold 0 one pass
        (``kernels.scan``) finds them, the absent blocks that hold a -0.0, and the peaks
        (max |x|) of the present ones; with a threshold, every block's peak decides. A
        chunk's exponent comes from the largest peak among its blocks that are sent: with
        threshold 0 that is the chunk's max |x|, the dense exponent. Absent blocks are then
        cleared to +0.0 (they may hold -0.0 or, with a threshold, small values), so that
        the output's zeros are exactly what dense mode gives.
        """
        b = self.block
        if b < 1 or self.k % b:
            raise ExchangeError(f"sparse block {b} must divide k = {self.k}")
        self.m = self.k // b
        sent = np.zeros(self.chunks * self.m, dtype=np.float32)
        if self.threshold == 0:
            known = self.presence  # the DDP hook's pass over this tensor, if it made one
            if known is not None and known.block == b and \
                    len(known.present) == -(-len(self.data) // b):
                self.mask, negative_zero = known.present, known.negative_zero
                sent[: len(self.mask)] = peaks_of_present(self.data, b, self.mask)
            else:
                self.mask, negative_zero, peaks = self.kernels.scan(self.data, b)
                sent[: len(self.mask)] = peaks
            keep = ~negative_zero  # an absent block holds +-0: clear just the -0.0 ones
        else:
            peaks = block_peaks(self.data, b)
            self.mask = ~(peaks <= self.threshold)  # NaN blocks travel: all must see them
            sent[: len(peaks)] = np.where(self.mask, peaks, 0.0)
            keep = self.mask
        exps = exponents_of_peaks(sent.reshape(self.chunks, self.m).max(axis=1)
                                  if self.chunks else np.zeros(0, np.float32))
        if not keep.all():
            zero_absent_blocks(self.data, keep, b)
        self.group_mask = np.zeros((self.chunks, self.m), dtype=bool)
        self.group_mask.reshape(-1)[: len(self.mask)] = self.mask
        self.group_blocks = self.group_mask.sum(axis=1)
        self.packed = pack_masks(self.group_mask)  # per group: its mask as u32 words
        self.union_blocks = 0  # blocks that came back non-zero (the global density)
        return exps

    def __post_init__(self) -> None:
        super().__post_init__()
        count = max(len(self.positions), 1)
        nonzero = self.group_blocks > 0
        self.mine = [np.flatnonzero(nonzero[p::count]) * count + p for p in range(count)]
        self.cursor = [0] * count

    # -- look-ahead and packets -----------------------------------------------------------
    def _look(self, index: int) -> np.ndarray:
        """The position's next LOOKAHEAD groups of this worker: (group, exponent, mask...)."""
        groups = self.mine[index][self.cursor[index]: self.cursor[index] + LOOKAHEAD]
        if not len(groups):
            return np.zeros((0, data_width(self.m)), np.int64)
        return np.concatenate([groups[:, None], self.exps[groups].astype(np.int64)[:, None],
                               self.packed[groups]], axis=1)

    def _next_round(self, pos: _Position) -> None:
        pos.seq = self.seqs[pos.shard][pos.slot]
        self.seqs[pos.shard][pos.slot] += 1
        pos.new_round()

    def _header(self, pos: _Position, numel: int, tsi: int, flags: int = SPARSE) -> Header:
        shard = self.shards[pos.shard]
        return Header(DATA, shard.job, self.rank, pos.slot, numel, pos.seq, tsi, EXP_ZERO,
                      flags=flags)

    def _answer_size(self, pos: _Position) -> int:
        """A sparse result's size is unknown before it arrives: a RESEND pads to the most a
        datagram can carry."""
        assert pos.header is not None
        if pos.header.flags & SPARSE:
            return MAX_DATAGRAM - HEADER_SIZE - self.shards[pos.shard].channel.tag_size
        return super()._answer_size(pos)

    def start(self, now: float) -> list[Send]:
        self.last_progress = now
        return [self._announce(pos, now) for pos in self.positions]

    def _send_groups(self, pos: _Position, mine: np.ndarray, plan: dict[int, int],
                     now: float) -> Send:
        """Send this worker's non-zero blocks of the planned groups it has (``mine``, maybe
        none): one gather and one quantization for all of them, exponent per group."""
        self._next_round(pos)
        exps = np.array([plan[int(g)] for g in mine], dtype=np.int64)
        q = self.kernels.quantize(self.data, self.block, self.m, mine, self.group_mask, exps,
                                  self.workers)
        self.cursor[pos.index] += len(mine)
        pos.chunk = min(plan)
        pos.header = self._header(pos, q.size, min(plan) * self.k)
        pos.payload = np.frombuffer(encode(self._look(pos.index),
                                           Blocks(mine, self.group_mask[mine], q)),
                                    dtype=np.uint8)
        return self._send(pos, now)

    # -- results --------------------------------------------------------------------------
    def _write(self, part: Blocks, exps: np.ndarray) -> None:
        """Dequantize the summed blocks of a result into the output (all groups at once),
        each group with its agreed exponent ``exps``."""
        if not len(part.groups):
            return
        self.kernels.dequantize(self.out, self.block, self.m, part.groups, part.mask,
                                part.values, exps, self.workers)
        self.union_blocks += int(np.count_nonzero(part.mask))

    def _announce(self, pos: _Position, now: float) -> Send:
        """An announce round: no values, this worker's look-ahead (after a dense run)."""
        self._next_round(pos)
        pos.chunk = -1
        pos.header = self._header(pos, 0, len(self.data) & 0xFFFFFFFF, SPARSE | ANNOUNCE)
        pos.payload = np.frombuffer(encode(self._look(pos.index), Blocks.empty()),
                                    dtype=np.uint8)
        self.plans[pos.index] = {}
        return self._send(pos, now)

    def _dense_round(self, pos: _Position, now: float, e_max: int) -> Send:
        """The next group of a dense run, as a plain dense round."""
        run = self.runs[pos.index]
        group, _ = run.pop(0)
        self.cursor[pos.index] += 1
        # announce the exponent of the run's next group (the base announces chunk + P)
        following = int(self.exps[run[0][0]]) if run else EXP_ZERO
        return self._arm(pos, group, e_max, now, next_exp=following)

    def _on_result(self, pos: _Position, hdr: Header, payload: memoryview | bytes,
                   now: float) -> list[Send] | None:
        if not hdr.flags & SPARSE:  # a dense round of a run
            if pos.chunk < 0 or pos.index not in self.runs or pos.header is None or \
                    hdr.numel != pos.header.numel or len(payload) != 4 * hdr.numel:
                return None   # (a RESULT flagged PROBE skips check_length)
            lo = pos.chunk * self.k
            dequantize_into(self.out[lo: lo + hdr.numel],
                            np.frombuffer(payload, dtype=np.int32), pos.e_used, self.workers)
            self.union_blocks += self.m  # a run's groups are full on every worker
            if self.runs[pos.index]:
                return [self._dense_round(pos, now, hdr.exp)]
            del self.runs[pos.index]
            return [self._announce(pos, now)]
        try:
            head, part = decode(payload, hdr.numel, self.block, RESULT_WIDTH)
        except ValueError:
            return None
        current = self.plans.get(pos.index, {})
        exps = [current.get(g) for g in part.groups.tolist()]
        if exps and (part.mask.shape[1] != self.m or None in exps):
            return None  # not this round's result
        self._write(part, np.array(exps, dtype=np.int64))
        plan = dict(zip(head[:, 0].tolist(), signed32(head[:, 1]).tolist()))
        self.plans[pos.index] = plan
        if not plan:
            pos.done = True
            return []
        if EXP_NONFINITE in plan.values():
            self._nonfinite()
            return []
        count = max(len(self.positions), 1)
        if any(g >= self.chunks or g % count != pos.index for g in plan):
            return self._bad_plan(pos, plan)
        if hdr.flags & RUN:
            self.runs[pos.index] = sorted(plan.items())
            first_exp = self.runs[pos.index][0][1]
            return [self._dense_round(pos, now, first_exp)]
        upcoming = self.mine[pos.index][self.cursor[pos.index]:]
        mine = upcoming[upcoming <= max(plan)]
        # every group this worker sends was planned, and its blocks fit one datagram
        if any(int(g) not in plan for g in mine) or self.group_blocks[mine].sum() > self.m:
            return self._bad_plan(pos, plan)
        return [self._send_groups(pos, mine, plan, now)]

    def _bad_plan(self, pos: _Position, plan: dict[int, int]) -> list[Send]:
        self.error = ExchangeError(f"the switch planned groups {sorted(plan)[:4]} for window "
                                   f"position {pos.index}: the workers' tensors differ")
        return []
