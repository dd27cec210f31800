"""The sparse switch's rounds: check and add a contribution, plan the next round. Pure.

Streaming aggregation (docs/references.md: OmniReduce): an announce round tells the switch
where every worker's next non-zero groups are; each later round carries only the planned
blocks and the sender's next look-ahead; the switch adds them and plans the round after.
"""

from __future__ import annotations

import numpy as np

from dlcomm.switch.planning import plan_round
from dlcomm.switch.slots import JobSlots, SlotCopy
from dlcomm.wire.packet import Header
from dlcomm.wire.quant import EXP_MAX, EXP_MIN, EXP_NONFINITE, EXP_ZERO
from dlcomm.wire.sparse import LOOKAHEAD, Blocks, data_width, signed32, unpack_masks
from dlcomm.wire.sparse import decode as decode_sparse
from dlcomm.wire.sparse import encode as encode_sparse

__all__ = ["valid_exponents", "add_sparse", "finish_sparse"]


def valid_exponents(exps: np.ndarray) -> bool:
    """Every announced exponent is one a worker can produce (wire/quant.valid_exponent)."""
    ordinary = (exps >= EXP_MIN) & (exps <= EXP_MAX)
    return bool((ordinary | (exps == EXP_ZERO) | (exps == EXP_NONFINITE)).all())


def add_sparse(slots: JobSlots, hdr: Header, payload: memoryview | bytes,
                copy: SlotCopy) -> str:
    """Add a sparse contribution and record the sender's look-ahead; or, touching
    nothing, name why it is dropped: "length" (malformed payload), "bad_exponent" (a
    look-ahead exponent no worker announces: its maximum goes into a result header's
    16-bit field), "bad_value" (beyond the job's int32 limit) or "unplanned" (values in
    an announce round, groups or blocks outside this round's plan)."""
    job = slots.job
    m = job.k // job.block
    try:
        head, part = decode_sparse(payload, hdr.numel, job.block, data_width(m))
        unpack_masks(head[:, 2:], m)  # the look-ahead's masks: no bit beyond m
    except ValueError:
        return "length"
    exps = signed32(head[:, 1])
    if not valid_exponents(exps):
        return "bad_exponent"
    values = part.values
    if values.size and (int(values.max()) > job.limit or int(values.min()) < -job.limit):
        return "bad_value"
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
        copy.sums[at] += values
    stream = slots.streams[hdr.slot]
    assert stream is not None
    head[:, 1] = exps
    stream.looks[hdr.worker] = head
    return ""

def finish_sparse(slots: JobSlots, slot: int, copy: SlotCopy) -> None:
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
