"""The switch's dataplane: a pure state machine, ``on_datagram(data, src, now) -> outputs``.

Per job slot there are two copies (a slot round with sequence number ``seq`` uses copy
``seq % 2``); each copy holds an int32 accumulator of k elements, the maximum of announced
exponents, a count of missing contributions and a bitmap of the workers that contributed
(REFERENCES.md section 1, SwitchML). For a DATA packet from worker w:

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
from dlcomm.wire.packet import (COMPLETE, DATA, ERROR, PROBE, RESEND, RESULT, STATUS,
                                SWITCH_RANK, Header, Malformed, decode)
from dlcomm.wire.quant import EXP_ZERO

__all__ = ["Dataplane", "Output", "SlotCopy"]

Output = tuple[Address, Header, bytes | memoryview]
ERROR_REPLY_INTERVAL_S = 0.1


@dataclass(slots=True)
class SlotCopy:
    seq: int = -1
    remaining: int = 0
    bitmap: int = 0
    exp: int = EXP_ZERO
    tsi: int = 0
    numel: int = 0
    acc: np.ndarray | None = None


class _JobSlots:
    """The slot copies of one job, allocated when the job registers."""

    __slots__ = ("job", "copies")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.copies = [(SlotCopy(acc=np.zeros(job.k, dtype=np.int32)),
                        SlotCopy(acc=np.zeros(job.k, dtype=np.int32)))
                       for _ in range(job.slot_count)]


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
            return self._unknown_job(hdr, src, now)
        job = slots.job
        if hdr.key != job.key:
            return self._drop("bad_key", job)
        if hdr.worker >= job.workers or job.addresses[hdr.worker] != src:
            return self._drop("bad_source", job)
        if hdr.slot >= job.slot_count:
            return self._drop("bad_slot", job)
        if hdr.numel > job.k:
            return self._drop("too_large", job)
        job.last_packet = now
        job.counters["packets_in"] = job.counters.get("packets_in", 0) + 1
        job.counters["bytes_in"] = job.counters.get("bytes_in", 0) + len(data)
        pair = slots.copies[hdr.slot]
        copy = pair[hdr.seq & 1]
        if hdr.seq < copy.seq:
            return self._drop("stale", job)
        if hdr.flags & PROBE:
            return self._probe(job, hdr, copy, src)
        if hdr.seq > copy.seq:
            if copy.remaining:
                return self._drop("out_of_order", job)
            copy.seq, copy.remaining, copy.bitmap = hdr.seq, job.workers, 0
            copy.exp, copy.tsi, copy.numel = EXP_ZERO, hdr.tsi, hdr.numel
        bit = 1 << hdr.worker
        if copy.bitmap & bit:
            self.counters["retransmissions"] += 1
            job.counters["retransmissions"] = job.counters.get("retransmissions", 0) + 1
            if copy.remaining == 0:
                return [(src, *self._result(job, hdr.slot, copy))]
            return [self._status(job, hdr.slot, copy.seq, copy.bitmap, src, False)]
        if copy.remaining == 0:
            # The round is complete but w's bit is clear: w's next round on this slot cleared
            # it, so this is a late duplicate from before that; it must not touch the result.
            return self._drop("stale", job)
        if hdr.tsi != copy.tsi or hdr.numel != copy.numel:
            return self._mismatch(job, hdr, copy)
        copy.bitmap |= bit
        pair[1 - (hdr.seq & 1)].bitmap &= ~bit
        values = np.frombuffer(payload, dtype=np.int32)
        assert copy.acc is not None
        if copy.remaining == job.workers:
            copy.acc[: hdr.numel] = values
        else:
            copy.acc[: hdr.numel] += values
        if hdr.exp > copy.exp:
            copy.exp = hdr.exp
        copy.remaining -= 1
        if copy.remaining:
            return []
        self.counters["completions"] += 1
        job.counters["completions"] = job.counters.get("completions", 0) + 1
        header, body = self._result(job, hdr.slot, copy)
        if job.group is not None:
            return [(job.group, header, body)]
        return [(addr, header, body) for addr in job.addresses]

    def _probe(self, job: Job, hdr: Header, copy: SlotCopy, src: Address) -> list[Output]:
        self.counters["probes"] += 1
        if hdr.seq > copy.seq:  # nobody's contribution to this round has arrived yet
            return [self._status(job, hdr.slot, hdr.seq, 0, src)]
        complete = copy.remaining == 0
        if complete and hdr.flags & RESEND and copy.bitmap >> hdr.worker & 1:
            self.counters["resent_results"] += 1
            return [(src, *self._result(job, hdr.slot, copy))]
        return [self._status(job, hdr.slot, copy.seq, copy.bitmap, src, complete)]

    @staticmethod
    def _status(job: Job, slot: int, seq: int, bitmap: int, src: Address,
                complete: bool = False) -> Output:
        status = Header(STATUS, job.job_id, SWITCH_RANK, slot, 0, seq, 0, 0, job.key,
                        COMPLETE if complete else 0)
        return (src, status, bitmap.to_bytes((job.workers + 7) // 8, "little"))

    def _result(self, job: Job, slot: int, copy: SlotCopy) -> tuple[Header, memoryview]:
        assert copy.acc is not None
        header = Header(RESULT, job.job_id, SWITCH_RANK, slot, copy.numel, copy.seq, copy.tsi,
                        copy.exp, job.key)
        return header, memoryview(copy.acc[: copy.numel]).cast("B")

    def _mismatch(self, job: Job, hdr: Header, copy: SlotCopy) -> list[Output]:
        self._drop("mismatch", job)
        if hdr.numel == 0 and copy.numel == 0:  # exponent rounds carry the tensor's length
            text = (f"rank {hdr.worker} all-reduces {hdr.tsi} elements, other ranks "
                    f"{copy.tsi}: the workers' tensors differ").encode()
        else:
            text = (f"rank {hdr.worker} sent chunk at element {hdr.tsi} with {hdr.numel} "
                    f"elements for slot {hdr.slot} round {hdr.seq}, but other ranks sent element "
                    f"{copy.tsi} with {copy.numel}: the workers' tensors differ").encode()
        err = Header(ERROR, job.job_id, SWITCH_RANK, hdr.slot, 0, hdr.seq, hdr.tsi, 0, job.key)
        return [(addr, err, text) for addr in job.addresses]

    def _unknown_job(self, hdr: Header, src: Address, now: float) -> list[Output]:
        """Tell the sender once in a while (rate-limited, never larger than what it sent)."""
        self._drop("unknown_job")
        if now - self._last_error_reply.get(src, -1e9) < ERROR_REPLY_INTERVAL_S:
            return []
        self._last_error_reply[src] = now
        if len(self._last_error_reply) > 4096:
            self._last_error_reply.clear()
        err = Header(ERROR, hdr.job, SWITCH_RANK, hdr.slot, 0, hdr.seq, hdr.tsi, 0, 0)
        return [(src, err, b"unknown job (the switch restarted or the job ended)")]

    def slots_in_use(self) -> int:
        return self.table.slots_in_use()
