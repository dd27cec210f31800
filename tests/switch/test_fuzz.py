"""Fuzz the pure dataplane: no input may raise, amplify, or change an honest job's sums.

Two jobs share a dataplane: the attacker's own (it holds that job's keys, so its packets
reach rounds, exponents, values and sparse plans) and a victim's, whose packets the attacker
only sees (it replays, mutates and forges them). A short run is part of the default suite;
``pytest -m slow`` (``make bench``) runs a long one. The live campaign against a switch on
loopback is ``dlcomm bench fuzz`` (tests/switch/test_live_fuzz.py runs a short one).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import JobTable
from dlcomm.testing.fuzz import FuzzTarget, Mutator
from dlcomm.wire.packet import DATA, HEADER_SIZE, RESULT, Header, decode_header
from tests.switch.crew import Crew

ATTACKER = [("10.0.0.1", 7000), ("10.0.0.2", 7000), ("10.0.0.3", 7000)]
VICTIM = [("10.0.1.1", 7000), ("10.0.1.2", 7000)]
STRANGER = ("10.9.9.9", 4444)


def fresh(block: int):
    table = JobTable(16, 64)
    plane = Dataplane(table)
    jobs = [table.register(ATTACKER, 4, 16, block=block), table.register(VICTIM, 4, 16)]
    for job in jobs:
        job.live = True
        plane.add_job(job)
    return plane, Crew(jobs[0]), Crew(jobs[1])


def check_outputs(plane, crews, datagram, src, outputs):
    """What one datagram caused: every datagram packs and verifies under its receiver's
    keys; no more than one answer, never larger than the datagram, unless it completed a
    round (whose result goes to the job's verified addresses)."""
    for addr, parts in outputs:
        whole = b"".join(bytes(p) for p in parts)
        hdr = decode_header(whole)
        crew = next(c for c in crews if c.job.job_id == hdr.job)
        assert addr in crew.job.addresses
        rank = crew.job.addresses.index(addr)
        crew.channels[rank].open(hdr, memoryview(whole))   # raises if forged or replayed
    completed = any(decode_header(b"".join(bytes(p) for p in parts)).type == RESULT and
                    len(outputs) > 1 for _, parts in outputs)
    if not completed:
        assert len(outputs) <= 1
        assert sum(len(p) for _, parts in outputs for p in parts) <= len(datagram)
        assert all(addr == src for addr, _ in outputs)


def honest_round(plane, crew, slot, seq, values, seen):
    """One round of every rank of ``crew``; ``seen`` hears every datagram sent."""
    outs = []
    for rank, addr in enumerate(crew.job.addresses):
        datagram = crew.data(rank, values[rank], slot=slot, seq=seq)
        seen(datagram, rank)
        outs = plane.on_datagram(datagram, addr)
    return crew.values(outs)


def own_mutator(plane, crew, seed):
    """The attacker's job anew once it failed (as an attacker would register again)."""
    if crew.job.failure:
        plane.remove_job(crew.job.job_id)
        job = plane.table.register(ATTACKER, 4, 16, block=crew.job.block)
        job.live = True
        plane.add_job(job)
        crew.__init__(job)
    target = FuzzTarget(crew.job.job_id, 3, 4, 16, crew.job.block, tuple(crew.channels))
    return Mutator(target, seed)


def run_campaign(seed: int, count: int, block: int = 0) -> dict[str, int]:
    """``count`` attack datagrams; the attacker's own job's completions (deep paths)."""
    plane, attacker, victim = fresh(block)
    own = own_mutator(plane, attacker, seed)
    theirs = Mutator(FuzzTarget(victim.job.job_id, 2, 4, 16), seed + 1)
    rng = np.random.default_rng(seed)
    seq = 0
    attacker_rounds = 0
    for i in range(count):
        if attacker.job.failure:
            attacker_rounds += attacker.job.counters.get("completions", 0)
            own = own_mutator(plane, attacker, seed + i)
        mutator, crew = (own, attacker) if i % 2 else (theirs, victim)
        datagram, rank = mutator.next()
        src = crew.job.addresses[rank] if rank >= 0 else STRANGER
        outputs = plane.on_datagram(datagram, src, now=i * 1e-3)
        check_outputs(plane, [attacker, victim], datagram, src, outputs)
        if i % 25 == 0:  # the victim all-reduces meanwhile; the attacker sees its packets
            values = rng.integers(-1000, 1000, (2, 8), dtype=np.int32)
            result = honest_round(plane, victim, seq % 4, 2 * (seq // 4), values,
                                  theirs.observe)
            assert [v for _, _, v in result] == [values.sum(axis=0).tolist()] * 2
            seq += 1
    assert not victim.job.failure
    assert plane.counters["packets_in"] >= count
    return {"attacker_rounds": attacker_rounds + attacker.job.counters.get("completions", 0),
            **plane.counters}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.sampled_from([0, 4]))
def test_fuzz_short(seed, block):
    run_campaign(seed, 300, block)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.sampled_from([0, 4]))
def test_fuzz_long(seed, block):
    run_campaign(seed, 2000, block)


def test_a_replayed_honest_packet_is_refused():
    plane, _, victim = fresh(0)
    first = victim.data(0, [1, 2], slot=0, seq=0)
    assert plane.on_datagram(first, VICTIM[0]) == []
    assert plane.on_datagram(first, VICTIM[0]) == []
    assert plane.counters["drop_replay"] == 1


def test_a_forged_header_on_a_sniffed_packet_is_refused():
    plane, _, victim = fresh(0)
    good = bytearray(victim.data(0, [1, 2], slot=0, seq=0))
    good[HEADER_SIZE] ^= 1   # change a value: the tag no longer verifies
    assert plane.on_datagram(bytes(good), VICTIM[0]) == []
    assert plane.counters["drop_bad_tag"] == 1
    forged = Header(DATA, victim.job.job_id, 0, 0, 2, 0, 0, 0).pack() + bytes(8 + 16)
    assert plane.on_datagram(forged, VICTIM[0]) == []
    assert plane.counters["drop_bad_tag"] == 2
