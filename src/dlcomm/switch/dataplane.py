"""The switch's dataplane: a pure state machine, ``on_datagram(data, src, now) -> outputs``.

Per job slot there are two copies (a slot round with sequence number ``seq`` uses copy
``seq % 2``); each copy holds an int32 accumulator of k elements, the maximum of announced
exponents, a count of missing contributions and a bitmap of the workers that contributed
(docs/references.md: SwitchML). For a DATA packet from worker w:

1. drop it silently (and count why) if it is malformed, foreign, of an unknown job or of a
   job not live yet, comes from an address other than worker w's, fails its tag (a forgery,
   wire/auth.py) or replays an earlier counter, names a slot outside the job's range, holds
   more than k elements, or announces an exponent or carries a value no worker can produce
   (values beyond the job's int32 limit would wrap the sum); nothing is answered to what is
   not authentic;
2. a ``seq`` older than the copy's is a stale packet: drop; the copy's next round is
   ``seq + 2`` and only that starts a new round (a jump ahead, such as 0xFFFFFFFF, cannot jam
   the slot), and only once the copy's round is complete (workers self-clock);
3. if w's bit is already set in the copy, this is a retransmission: unicast the stored
   result back if the round is complete; otherwise answer with a STATUS packet listing who
   has contributed (dlcomm's addition: it lets a worker name a missing rank);
   a PROBE (a header and zero padding, dlcomm's addition) is answered with a STATUS
   (flagged COMPLETE if the round is complete), or with the result if it also asks to
   RESEND and the round is complete;
4. otherwise set w's bit (and clear it in the other copy), store or add the payload, take
   the maximum exponent; when the last contribution arrives, send the RESULT to every worker
   of the job (once, to the job's multicast group, when it has one).

No answer is ever larger than the datagram that caused it (a probe pads itself to the size
of the answer it asks for), and no packet causes more than one answer: the switch cannot
amplify. Workers that disagree about a chunk (its offset or length) fail the job: the
sender gets one ERROR, every worker learns it from the control channel
(:attr:`Dataplane.failures`), and each later packet of the job is answered by at most one
ERROR per worker per :data:`ERROR_REPLY_INTERVAL_S`. Outputs are ``(address, parts)``:
datagrams already sealed by the job's channel; the I/O shell sends them. A dense result is
sealed in place, in the frame its accumulator lives in (no copy), so outputs are valid until
the next :meth:`Dataplane.on_datagram`: a caller that keeps them copies them.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from dlcomm.switch.jobs import Address, Job, JobTable
from dlcomm.switch.slots import (
    JobSlots,
    SlotCopy,
    Stream,
    add_dense,
    dense_values,
    next_of,
    older,
    popcount,
)
from dlcomm.switch.sparse_rounds import add_sparse, finish_sparse
from dlcomm.wire.channel import Forged, Framed, Parts, Replayed
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
    check_length,
    decode_header,
)
from dlcomm.wire.quant import EXP_ZERO, valid_exponent

__all__ = ["Dataplane", "Output", "SlotCopy"]

Output = tuple[Address, Parts]
ERROR_REPLY_INTERVAL_S = 0.1


def _refusal(job: Job, hdr: Header, src: Address) -> str:
    """Why a DATA packet of ``job`` must be dropped before its tag is checked ("" if not):
    a source that is not the worker's address, a slot or size beyond the job's, sparse
    rounds for a dense job, an exponent no worker announces."""
    if hdr.worker >= job.workers or job.addresses[hdr.worker] != src:
        return "bad_source"
    if hdr.slot >= job.slot_count:
        return "bad_slot"
    if hdr.numel > job.k:
        return "too_large"
    if hdr.flags & SPARSE and not job.block:
        return "not_sparse"
    if not valid_exponent(hdr.exp):
        return "bad_exponent"
    return ""


class Dataplane:
    """All jobs' slots and the packet logic; counters of everything it did."""

    def __init__(self, table: JobTable) -> None:
        self.table = table
        self._slots: dict[int, JobSlots] = {}
        self.counters: Counter[str] = Counter()
        self.failures: list[tuple[int, str]] = []  # (job, why): for the control plane to tell

    # -- control -----------------------------------------------------------------------
    def add_job(self, job: Job) -> None:
        self._slots[job.job_id] = JobSlots(job)

    def remove_job(self, job_id: int) -> None:
        self._slots.pop(job_id, None)
        self.table.remove(job_id)

    def job_live(self, job: Job) -> None:
        """The control plane made ``job`` live (this dataplane reads ``job.live`` itself)."""

    def all_counters(self) -> dict[str, int]:
        return dict(self.counters)

    def sync(self, now: float) -> bool:
        """Bring the jobs' objects up to date (nothing to do here); True if one failed."""
        return False

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
            hdr = decode_header(data)
        except Malformed as exc:
            return self._drop(exc.reason)
        if hdr.type != DATA:
            return self._drop("type")
        slots = self._slots.get(hdr.job)
        if slots is None:
            return self._drop("unknown_job")  # no answer: job numbers stay unconfirmed
        job = slots.job
        refused = "not_live" if not job.live else _refusal(job, hdr, src)
        if refused:
            return self._drop(refused, job)
        try:
            payload = job.channel.open(hdr, memoryview(data))
            check_length(hdr, payload)
        except Forged:
            return self._drop("bad_tag", job)
        except Replayed:
            return self._drop("replay", job)
        except Malformed as exc:
            return self._drop(exc.reason, job)
        job.last_packet = now
        job.counters["packets_in"] = job.counters.get("packets_in", 0) + 1
        job.counters["bytes_in"] = job.counters.get("bytes_in", 0) + len(data)
        if job.failure:
            return self._error(job, hdr, src, len(data), now)
        return self._round(slots, hdr, payload, src, len(data), now)

    def _round(self, slots: JobSlots, hdr: Header, payload: memoryview | bytes,
               src: Address, size: int, now: float) -> list[Output]:
        """An authentic DATA packet of a live job: its part in a slot round."""
        job = slots.job
        sparse = bool(hdr.flags & SPARSE)
        pair = slots.copies[hdr.slot]
        copy = pair[hdr.seq & 1]
        if older(hdr.seq, copy.seq):
            return self._drop("stale", job)
        if hdr.flags & PROBE:
            return self._probe(slots, hdr, copy, src, size)
        if hdr.seq != copy.seq:
            if hdr.seq != next_of(copy.seq, hdr.seq) or copy.remaining:
                return self._drop("out_of_order", job)
            if not self._start_round(slots, hdr, copy, sparse, now):
                return self._drop("out_of_order", job)
        bit = 1 << hdr.worker
        if copy.bitmap & bit:
            self.counters["retransmissions"] += 1
            job.counters["retransmissions"] = job.counters.get("retransmissions", 0) + 1
            if copy.remaining == 0:
                return self._answer(job, hdr.worker, src, size, *self._result(job, hdr.slot,
                                                                               copy))
            return self._answer(job, hdr.worker, src, size,
                                *self._status(job, hdr.slot, copy.seq,
                                              copy.expected & ~copy.bitmap))
        if copy.remaining == 0:
            # The round is complete but w's bit is clear: w's next round on this slot cleared
            # it, so this is a late duplicate from before that; it must not touch the result.
            return self._drop("stale", job)
        if not copy.expected & bit or sparse != copy.sparse:
            return self._mismatch(job, hdr, copy, src, size, now, "sent a packet out of turn")
        if hdr.tsi != copy.tsi or (not sparse and hdr.numel != copy.numel):
            return self._mismatch(job, hdr, copy, src, size, now)
        if sparse:
            reason = add_sparse(slots, hdr, payload, copy)
            if reason:
                return self._drop(reason, job)
        else:
            values = dense_values(payload, job.limit)
            if values is None:
                return self._drop("bad_value", job)
            add_dense(copy, hdr, values)
        copy.bitmap |= bit
        pair[1 - (hdr.seq & 1)].bitmap &= ~bit
        copy.remaining -= 1
        return self._complete(slots, hdr, copy) if not copy.remaining else []

    def _answer(self, job: Job, rank: int, src: Address, size: int, header: Header,
                body: bytes | Framed) -> list[Output]:
        """One answer to the packet from ``src`` (``size`` bytes), if it is no larger."""
        if HEADER_SIZE + len(body) + job.channel.tag_size > size:
            return self._drop("answer_too_large", job)  # a probe pads itself to ask
        return [(src, job.channel.seal(header, body, to=rank))]

    def _complete(self, slots: JobSlots, hdr: Header, copy: SlotCopy) -> list[Output]:
        """Every contribution of the round is in: its result to every worker."""
        job = slots.job
        if copy.sparse:
            finish_sparse(slots, hdr.slot, copy)
        self.counters["completions"] += 1
        job.counters["completions"] = job.counters.get("completions", 0) + 1
        parts = job.channel.seal(*self._result(job, hdr.slot, copy))
        if job.group is not None:
            return [(job.group, parts)]
        return [(addr, parts) for addr in job.addresses]

    def _start_round(self, slots: JobSlots, hdr: Header, copy: SlotCopy, sparse: bool,
                     now: float) -> bool:
        """Begin round ``hdr.seq`` on ``copy``; False if its participants are unknown."""
        job = slots.job
        stream = slots.streams[hdr.slot]
        planned = sparse and not hdr.flags & ANNOUNCE
        if planned and (stream is None or stream.pending_seq != hdr.seq):
            return False  # not a round this slot planned: the copy stays as it was
        copy.seq, copy.bitmap, copy.exp, copy.tsi = hdr.seq, 0, EXP_ZERO, hdr.tsi
        copy.started = now
        copy.numel, copy.sparse, copy.run = hdr.numel, sparse, False
        if not sparse:
            copy.expected = slots.all
        elif hdr.flags & ANNOUNCE:  # a sparse announce round: everyone says where its data is
            copy.expected, copy.groups, copy.sums, copy.union = slots.all, None, None, None
            slots.streams[hdr.slot] = Stream(job.workers)
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
        copy.remaining = popcount(copy.expected)
        return True

    def _probe(self, slots: JobSlots, hdr: Header, copy: SlotCopy, src: Address,
               size: int) -> list[Output]:
        job = slots.job
        self.counters["probes"] += 1
        if hdr.seq != copy.seq:  # nobody's contribution to this round has arrived yet
            if hdr.seq != next_of(copy.seq, hdr.seq):
                return self._drop("out_of_order", job)
            return self._answer(job, hdr.worker, src, size,
                                *self._status(job, hdr.slot, hdr.seq, slots.all))
        complete = copy.remaining == 0
        if complete and hdr.flags & RESEND:
            self.counters["resent_results"] += 1
            return self._answer(job, hdr.worker, src, size, *self._result(job, hdr.slot, copy))
        return self._answer(job, hdr.worker, src, size,
                            *self._status(job, hdr.slot, copy.seq,
                                          copy.expected & ~copy.bitmap, complete))

    @staticmethod
    def _status(job: Job, slot: int, seq: int, waiting: int,
                complete: bool = False) -> tuple[Header, bytes]:
        """STATUS: the bitmap of the workers the round still waits for."""
        status = Header(STATUS, job.job_id, SWITCH_RANK, slot, 0, seq, 0, 0,
                        flags=COMPLETE if complete else 0)
        return status, waiting.to_bytes((job.workers + 7) // 8, "little")

    def _result(self, job: Job, slot: int, copy: SlotCopy) -> tuple[Header, bytes | Framed]:
        assert copy.frame is not None
        flags = (SPARSE | (RUN if copy.run else 0)) if copy.sparse else 0
        header = Header(RESULT, job.job_id, SWITCH_RANK, slot, copy.numel, copy.seq, copy.tsi,
                        copy.exp, flags=flags)
        if copy.sparse:
            return header, copy.result
        return header, Framed(copy.frame, 4 * copy.numel)   # sealed in place

    def _mismatch(self, job: Job, hdr: Header, copy: SlotCopy, src: Address, size: int,
                  now: float, why: str = "") -> list[Output]:
        """Workers disagree: the job fails (every worker hears it on the control channel)."""
        self._drop("mismatch", job)
        if why:
            text = (f"rank {hdr.worker} {why} (slot {hdr.slot}, round {hdr.seq}): the workers "
                    "disagree about the tensor or its sparsity")
        elif hdr.numel == 0 and copy.numel == 0:  # exponent rounds carry the tensor's length
            text = (f"rank {hdr.worker} all-reduces {hdr.tsi} elements, other ranks "
                    f"{copy.tsi}: the workers' tensors differ")
        else:
            text = (f"rank {hdr.worker} sent chunk at element {hdr.tsi} with {hdr.numel} "
                    f"elements for slot {hdr.slot} round {hdr.seq}, but other ranks sent "
                    f"element {copy.tsi} with {copy.numel}: the workers' tensors differ")
        job.failure = text
        self.failures.append((job.job_id, text))
        return self._error(job, hdr, src, size, now)

    def _error(self, job: Job, hdr: Header, src: Address, size: int, now: float
               ) -> list[Output]:
        """An ERROR with the job's failure to the sender: at most one per worker per
        ERROR_REPLY_INTERVAL_S, never larger than the packet it answers."""
        last = job.error_replies.get(hdr.worker, -1e9)
        if now - last < ERROR_REPLY_INTERVAL_S:
            return self._drop("error_limited", job)
        job.error_replies[hdr.worker] = now
        room = size - HEADER_SIZE - job.channel.tag_size
        text = job.failure.encode()[: max(0, room)]
        err = Header(ERROR, job.job_id, SWITCH_RANK, hdr.slot, 0, hdr.seq, hdr.tsi, 0)
        self.counters["errors_sent"] += 1
        return [(src, job.channel.seal(err, text, to=hdr.worker))]

    def waiting(self, job_id: int, now: float) -> dict[str, object] | None:
        """The job's oldest incomplete round: the ranks it waits for and since when (the
        diagnosis of a job that hangs)."""
        slots = self._slots.get(job_id)
        if slots is None:
            return None
        open_rounds = [(c.started, slot, c) for slot, pair in enumerate(slots.copies)
                       for c in pair if c.remaining and c.bitmap]
        if not open_rounds:
            return None
        started, slot, copy = min(open_rounds, key=lambda r: r[0])
        missing = copy.expected & ~copy.bitmap
        return {"ranks": [r for r in range(slots.job.workers) if missing >> r & 1],
                "since_s": round(now - started, 3), "slot": slot, "round": copy.seq}

    def slots_in_use(self) -> int:
        return self.table.slots_in_use()
