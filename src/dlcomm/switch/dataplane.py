"""The switch's dataplane: a pure state machine, ``on_datagram(data, src, now) -> outputs``.

Per job slot there are two copies (a slot round with sequence number ``seq`` uses copy
``seq % 2``); each copy holds an int32 accumulator of k elements, the maximum of announced
exponents, a count of missing contributions and a bitmap of the workers that contributed
(docs/references.md: SwitchML). For a DATA packet from worker w:

1. drop it (and count why) if it is malformed, foreign, of an unknown job, carries a wrong
   key, comes from an address not registered for worker w, names a slot outside the job's
   range, or holds more than k elements;
2. a ``seq`` older than the copy's is a stale packet: drop;
   a newer one starts a new round of the copy (the previous round of this copy is complete,
   since workers self-clock: nobody reuses a slot before its result arrived);
3. if w's bit is already set in the copy, this is a retransmission: unicast the stored
   result back if the round is complete; otherwise answer with a STATUS packet listing who
   has contributed (dlcomm's addition: it lets a worker name a missing rank);
   a PROBE (header only, dlcomm's addition) is answered with a STATUS (flagged COMPLETE if
   the round is complete), or with the result if it also asks to RESEND and the round is
   complete, so a worker whose timer fired while the round waits for others, or while its
   result is still on the way, need not resend its payload;
4. otherwise set w's bit (and clear it in the other copy), store or add the payload, take
   the maximum exponent; when the last contribution arrives, send the RESULT to every worker
   of the job (once, to the job's multicast group, when it has one).

Workers that disagree about a chunk (its offset or length) get an ERROR packet, all of
them, instead of a silent hang. Outputs are ``(address, header, payload)`` triples; the
I/O shell sends them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from dlcomm.switch.jobs import Address, Job, JobTable
from dlcomm.switch.planning import Plan, plan_round
from dlcomm.wire.packet import (
    ANNOUNCE,
    COMPLETE,
    DATA,
    ERROR,
    HEADER_SIZE,
    PROBE,
    RESEND,
    RESULT,
    RUN,
    SPARSE,
    STATUS,
    SWITCH_RANK,
    Header,
    Malformed,
    decode,
)
from dlcomm.wire.quant import EXP_ZERO
from dlcomm.wire.sparse import LOOKAHEAD, Blocks, data_width, signed32, unpack_masks
from dlcomm.wire.sparse import decode as decode_sparse
from dlcomm.wire.sparse import encode as encode_sparse

__all__ = ["Dataplane", "Output", "SlotCopy"]

Output = tuple[Address, Header, bytes | memoryview]
ERROR_REPLY_INTERVAL_S = 0.1
UNKNOWN_JOB = b"unknown job (the switch restarted or the job ended)"


@dataclass(slots=True)
class SlotCopy:
    seq: int = -1
    remaining: int = 0
    expected: int = 0               # bitmap of the workers this round waits for
    bitmap: int = 0                 # bitmap of the workers that contributed
    exp: int = EXP_ZERO
    tsi: int = 0
    numel: int = 0
    acc: np.ndarray | None = None
    sparse: bool = False
    groups: np.ndarray | None = None  # sparse: this round's groups (sorted): rows of sums
    sums: np.ndarray | None = None   # sparse: int32 (planned blocks, b), in acc's memory
    union: np.ndarray | None = None  # sparse: bool (groups, m): the blocks planned
    rows: np.ndarray | None = None   # sparse: (groups, m) -> row of sums, -1 if not planned
    run: bool = False                # sparse: the result plans a dense run
    result: bytes = b""             # sparse: the encoded result payload


class _Stream:
    """Per slot, the look-ahead of streaming aggregation: every worker's announced next
    non-zero groups (group, exponent, non-zero blocks), and the next round they imply."""

    __slots__ = ("looks", "pending_seq", "pending")

    def __init__(self, workers: int) -> None:
        self.looks: list[np.ndarray] = [np.zeros((0, 2), np.int64)] * workers
        self.pending_seq = -1        # the round whose groups are planned
        self.pending = Plan.nothing(0)


class _JobSlots:
    """The slot copies of one job, allocated when the job registers."""

    __slots__ = ("job", "copies", "streams", "all")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.copies = [(SlotCopy(acc=np.zeros(job.k, dtype=np.int32)),
                        SlotCopy(acc=np.zeros(job.k, dtype=np.int32)))
                       for _ in range(job.slot_count)]
        self.streams: list[_Stream | None] = [None] * job.slot_count
        self.all = (1 << job.workers) - 1


def _popcount(bits: int) -> int:
    return bin(bits).count("1")


def _refusal(job: Job, hdr: Header, src: Address) -> str:
    """Why a DATA packet of ``job`` must be dropped before anything looks at it ("" if not):
    a wrong key, a source that is not the worker's address, a slot or size beyond the job's,
    sparse rounds for a dense job."""
    if hdr.key != job.key:
        return "bad_key"
    if hdr.worker >= job.workers or job.addresses[hdr.worker] != src:
        return "bad_source"
    if hdr.slot >= job.slot_count:
        return "bad_slot"
    if hdr.numel > job.k:
        return "too_large"
    if hdr.flags & SPARSE and not job.block:
        return "not_sparse"
    return ""


def _add_dense(copy: SlotCopy, hdr: Header, payload: memoryview) -> None:
    """Add a dense contribution's int32 values into the slot copy (the first one is copied)."""
    assert copy.acc is not None
    values = np.frombuffer(payload, dtype=np.int32)
    if copy.bitmap == 0:
        copy.acc[: hdr.numel] = values
    else:
        copy.acc[: hdr.numel] += values
    if hdr.exp > copy.exp:
        copy.exp = hdr.exp


class Dataplane:
    """All jobs' slots and the packet logic; counters of everything it did."""

    def __init__(self, table: JobTable) -> None:
        self.table = table
        self._slots: dict[int, _JobSlots] = {}
        self.counters: Counter[str] = Counter()
        self._last_error_reply: dict[Address, float] = {}

    # -- control -----------------------------------------------------------------------
    def add_job(self, job: Job) -> None:
        self._slots[job.job_id] = _JobSlots(job)

    def remove_job(self, job_id: int) -> None:
        self._slots.pop(job_id, None)
        self.table.remove(job_id)

    # -- data ----------------------------------------------------------------------------
    def _drop(self, reason: str, job: Job | None = None) -> list[Output]:
        self.counters[f"drop_{reason}"] += 1
        if job is not None:
            job.counters[f"drop_{reason}"] = job.counters.get(f"drop_{reason}", 0) + 1
        return []

    def on_datagram(self, data: bytes | bytearray | memoryview, src: Address,
                    now: float = 0.0) -> list[Output]:
        """Process one received datagram; return what to send."""
        self.counters["packets_in"] += 1
        self.counters["bytes_in"] += len(data)
        try:
            hdr, payload = decode(data)
        except Malformed as exc:
            return self._drop(exc.reason)
        if hdr.type != DATA:
            return self._drop("type")
        slots = self._slots.get(hdr.job)
        if slots is None:
            return self._unknown_job(hdr, src, now, len(data))
        job = slots.job
        refused = _refusal(job, hdr, src)
        if refused:
            return self._drop(refused, job)
        sparse = bool(hdr.flags & SPARSE)
        job.last_packet = now
        job.counters["packets_in"] = job.counters.get("packets_in", 0) + 1
        job.counters["bytes_in"] = job.counters.get("bytes_in", 0) + len(data)
        pair = slots.copies[hdr.slot]
        copy = pair[hdr.seq & 1]
        if hdr.seq < copy.seq:
            return self._drop("stale", job)
        if hdr.flags & PROBE:
            return self._probe(slots, hdr, copy, src)
        if hdr.seq > copy.seq:
            if copy.remaining:
                return self._drop("out_of_order", job)
            if not self._start_round(slots, hdr, copy, sparse):
                return self._drop("out_of_order", job)
        bit = 1 << hdr.worker
        if copy.bitmap & bit:
            self.counters["retransmissions"] += 1
            job.counters["retransmissions"] = job.counters.get("retransmissions", 0) + 1
            if copy.remaining == 0:
                return [(src, *self._result(job, hdr.slot, copy))]
            return [self._status(job, hdr.slot, copy.seq, copy.expected & ~copy.bitmap, src)]
        if copy.remaining == 0:
            # The round is complete but w's bit is clear: w's next round on this slot cleared
            # it, so this is a late duplicate from before that; it must not touch the result.
            return self._drop("stale", job)
        if not copy.expected & bit or sparse != copy.sparse:
            return self._mismatch(job, hdr, copy, "sent a packet out of turn")
        if hdr.tsi != copy.tsi or (not sparse and hdr.numel != copy.numel):
            return self._mismatch(job, hdr, copy)
        if sparse:
            reason = self._add_sparse(slots, hdr, payload, copy)
            if reason:
                return self._drop(reason, job)
        else:
            _add_dense(copy, hdr, payload)
        copy.bitmap |= bit
        pair[1 - (hdr.seq & 1)].bitmap &= ~bit
        copy.remaining -= 1
        return self._complete(slots, hdr, copy) if not copy.remaining else []

    def _complete(self, slots: _JobSlots, hdr: Header, copy: SlotCopy) -> list[Output]:
        """Every contribution of the round is in: its result to every worker."""
        job = slots.job
        if copy.sparse:
            self._finish_sparse(slots, hdr.slot, copy)
        self.counters["completions"] += 1
        job.counters["completions"] = job.counters.get("completions", 0) + 1
        header, body = self._result(job, hdr.slot, copy)
        if job.group is not None:
            return [(job.group, header, body)]
        return [(addr, header, body) for addr in job.addresses]

    def _start_round(self, slots: _JobSlots, hdr: Header, copy: SlotCopy, sparse: bool) -> bool:
        """Begin round ``hdr.seq`` on ``copy``; False if its participants are unknown."""
        job = slots.job
        stream = slots.streams[hdr.slot]
        planned = sparse and not hdr.flags & ANNOUNCE
        if planned and (stream is None or stream.pending_seq != hdr.seq):
            return False  # not a round this slot planned: the copy stays as it was
        copy.seq, copy.bitmap, copy.exp, copy.tsi = hdr.seq, 0, EXP_ZERO, hdr.tsi
        copy.numel, copy.sparse, copy.run = hdr.numel, sparse, False
        if not sparse:
            copy.expected = slots.all
        elif hdr.flags & ANNOUNCE:  # a sparse announce round: everyone says where its data is
            copy.expected, copy.groups, copy.sums, copy.union = slots.all, None, None, None
            slots.streams[hdr.slot] = _Stream(job.workers)
        else:
            assert stream is not None
            # Every worker contributes, those without data in the groups with none: a slot
            # never runs ahead of a worker that has not received its previous result.
            copy.expected = slots.all
            plan = stream.pending
            copy.groups, copy.union = plan.groups, plan.union
            # at most m blocks (the capacity of a plan; announced masks have no bit beyond
            # m): their sums fit in the copy's accumulator of k = m x b
            blocks = np.flatnonzero(plan.union)
            copy.rows = np.full(plan.union.shape, -1, np.int64)
            copy.rows.reshape(-1)[blocks] = np.arange(len(blocks))
            assert copy.acc is not None
            copy.sums = copy.acc[: len(blocks) * job.block].reshape(len(blocks), job.block)
            copy.sums[:] = 0
        copy.remaining = _popcount(copy.expected)
        return True

    def _add_sparse(self, slots: _JobSlots, hdr: Header, payload: memoryview,
                    copy: SlotCopy) -> str:
        """Add a sparse contribution and record the sender's look-ahead; or, touching
        nothing, name why it is dropped: "length" (malformed payload) or "unplanned"
        (values in an announce round, groups or blocks outside this round's plan)."""
        job = slots.job
        m = job.k // job.block
        try:
            head, part = decode_sparse(payload, hdr.numel, job.block, data_width(m))
            unpack_masks(head[:, 2:], m)  # the look-ahead's masks: no bit beyond m
        except ValueError:
            return "length"
        if copy.groups is None:
            if len(part.groups):
                return "unplanned"  # values in an announce round
        elif len(part.groups):  # one accumulation for all the sender's blocks of this round
            rows = np.searchsorted(copy.groups, part.groups)
            if part.mask.shape[1] != m or rows[-1] >= len(copy.groups) or \
                    (copy.groups[rows] != part.groups).any():
                return "unplanned"  # groups not planned for this round (distinct: decoded)
            assert copy.sums is not None and copy.rows is not None
            segment, block = np.nonzero(part.mask)
            at = copy.rows[rows[segment], block]
            if (at < 0).any():
                return "unplanned"  # blocks nobody announced
            copy.sums[at] += part.values
        stream = slots.streams[hdr.slot]
        assert stream is not None
        head[:, 1] = signed32(head[:, 1])
        stream.looks[hdr.worker] = head
        return ""

    @staticmethod
    def _finish_sparse(slots: _JobSlots, slot: int, copy: SlotCopy) -> None:
        """The round is complete: plan the slot's next round from the look-ahead, and
        encode the result (the sums of this round's groups and the next round's plan)."""
        job = slots.job
        stream = slots.streams[slot]
        assert stream is not None
        m = job.k // job.block
        plan = plan_round(stream.looks, m, m, LOOKAHEAD)
        groups, exps = plan.groups, plan.exps
        copy.run = plan.run
        if plan.run:  # dense rounds follow; the position announces again afterwards
            stream.pending_seq = -1
        elif len(groups):
            stream.pending_seq = copy.seq + 1
            stream.pending = plan
        else:
            stream.pending_seq = -1
        part = Blocks.empty()
        if copy.groups is not None and len(copy.groups):
            assert copy.union is not None and copy.sums is not None
            sent = copy.union.any(axis=1)  # the planned blocks' sums, in the union's order
            part = Blocks(copy.groups[sent], copy.union[sent], copy.sums)
        copy.numel = part.values.size
        copy.exp = int(exps.max()) if len(exps) else EXP_ZERO
        copy.result = encode_sparse(np.stack([groups, exps], axis=1) if len(groups)
                                    else np.zeros((0, 2), np.int64), part)

    def _probe(self, slots: _JobSlots, hdr: Header, copy: SlotCopy, src: Address
               ) -> list[Output]:
        job = slots.job
        self.counters["probes"] += 1
        if hdr.seq > copy.seq:  # nobody's contribution to this round has arrived yet
            return [self._status(job, hdr.slot, hdr.seq, slots.all, src)]
        complete = copy.remaining == 0
        if complete and hdr.flags & RESEND:
            self.counters["resent_results"] += 1
            return [(src, *self._result(job, hdr.slot, copy))]
        return [self._status(job, hdr.slot, copy.seq, copy.expected & ~copy.bitmap, src,
                             complete)]

    @staticmethod
    def _status(job: Job, slot: int, seq: int, waiting: int, src: Address,
                complete: bool = False) -> Output:
        """STATUS: the bitmap of the workers the round still waits for."""
        status = Header(STATUS, job.job_id, SWITCH_RANK, slot, 0, seq, 0, 0, job.key,
                        COMPLETE if complete else 0)
        return (src, status, waiting.to_bytes((job.workers + 7) // 8, "little"))

    def _result(self, job: Job, slot: int, copy: SlotCopy) -> tuple[Header, bytes | memoryview]:
        assert copy.acc is not None
        flags = (SPARSE | (RUN if copy.run else 0)) if copy.sparse else 0
        header = Header(RESULT, job.job_id, SWITCH_RANK, slot, copy.numel, copy.seq, copy.tsi,
                        copy.exp, job.key, flags)
        if copy.sparse:
            return header, copy.result
        return header, copy.acc[: copy.numel].data.cast("B")

    def _mismatch(self, job: Job, hdr: Header, copy: SlotCopy, why: str = "") -> list[Output]:
        self._drop("mismatch", job)
        if why:
            text = (f"rank {hdr.worker} {why} (slot {hdr.slot}, round {hdr.seq}): the workers "
                    "disagree about the tensor or its sparsity").encode()
        elif hdr.numel == 0 and copy.numel == 0:  # exponent rounds carry the tensor's length
            text = (f"rank {hdr.worker} all-reduces {hdr.tsi} elements, other ranks "
                    f"{copy.tsi}: the workers' tensors differ").encode()
        else:
            text = (f"rank {hdr.worker} sent chunk at element {hdr.tsi} with {hdr.numel} "
                    f"elements for slot {hdr.slot} round {hdr.seq}, but other ranks sent element "
                    f"{copy.tsi} with {copy.numel}: the workers' tensors differ").encode()
        err = Header(ERROR, job.job_id, SWITCH_RANK, hdr.slot, 0, hdr.seq, hdr.tsi, 0, job.key)
        return [(addr, err, text) for addr in job.addresses]

    def _unknown_job(self, hdr: Header, src: Address, now: float, size: int) -> list[Output]:
        """Tell the sender once in a while (rate-limited, never larger than what it sent)."""
        self._drop("unknown_job")
        if now - self._last_error_reply.get(src, -1e9) < ERROR_REPLY_INTERVAL_S:
            return []
        self._last_error_reply[src] = now
        if len(self._last_error_reply) > 4096:
            self._last_error_reply.clear()
        err = Header(ERROR, hdr.job, SWITCH_RANK, hdr.slot, 0, hdr.seq, hdr.tsi, 0, 0)
        return [(src, err, UNKNOWN_JOB[: max(0, size - HEADER_SIZE)])]

    def slots_in_use(self) -> int:
        return self.table.slots_in_use()
