"""The native dataplane against its specification, the Python one: the same datagrams
(honest rounds with loss, duplication and reordering; probes; several jobs; the fuzz
mutator's random, forged, replayed and bent packets) give byte-identical outputs, the same
counters, the same failures and the same diagnosis of who a round waits for."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcomm.testing.fuzz import FuzzTarget, Mutator
from dlcomm.wire.auth import AUTH_ENCRYPT, AUTH_MAC, AUTH_NONE
from dlcomm.wire.packet import PROBE, RESEND
from tests.native.twins import Twins, needs_native
from tests.switch.crew import Crew

pytestmark = needs_native

STRANGER = ("10.9.9.9", 4444)


def addresses(job_index: int, workers: int):
    return [(f"10.0.{job_index}.{r + 1}", 7000 + r) for r in range(workers)]


def compare(twins: Twins, datagram: bytes, src, now: float) -> list:
    py, native = twins.feed(datagram, src, now)
    assert native == py
    return py


def check_state(twins: Twins, now: float) -> None:
    py, native = twins.counters()
    assert native == py
    for job in twins.jobs:
        assert twins.job_state(job, now)[1] == twins.job_state(job, now)[0]


def honest_packets(crew: Crew, rng: random.Random, rounds: int, slots: int, k: int):
    """Every rank's packets of ``rounds`` rounds per slot, with probes, shuffled a little,
    some duplicated and some lost (the switch's view of a lossy network)."""
    out = []
    for r in range(rounds):
        for slot in range(slots):
            numel = rng.choice([0, k, max(1, k // 2)])
            for rank in range(crew.job.workers):
                values = [rng.randint(-1000, 1000) for _ in range(numel)]
                pkt = crew.data(rank, values, slot=slot, seq=2 * r + (slot & 1), tsi=slot * k,
                                exp=rng.choice([0, 3, -32768]))
                src = crew.job.addresses[rank]
                if rng.random() > 0.1:
                    out.append((pkt, src))
                if rng.random() < 0.1:
                    out.append((pkt, src))   # a duplicate (replayed: refused)
                if rng.random() < 0.15:
                    flags = PROBE | (RESEND if rng.random() < 0.5 else 0)
                    out.append((crew.data(rank, values, slot=slot, seq=2 * r + (slot & 1),
                                          flags=flags), src))
    for i in range(len(out) - 1):   # local reordering
        if rng.random() < 0.2:
            out[i], out[i + 1] = out[i + 1], out[i]
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), workers=st.integers(1, 9),
       auth=st.sampled_from([AUTH_NONE, AUTH_MAC, AUTH_ENCRYPT]),
       k=st.sampled_from([1, 7, 64]), multicast=st.booleans())
def test_honest_rounds_with_loss_and_reordering(seed, workers, auth, k, multicast):
    rng = random.Random(seed)
    twins = Twins()
    try:
        job = twins.register(addresses(0, workers), 4, k, auth,
                             multicast_port=7000 if multicast else None)
        other = twins.register(addresses(1, 2), 2, 8, AUTH_MAC)
        twins.live(job)
        twins.live(other)
        crew, crew2 = Crew(job), Crew(other)
        packets = honest_packets(crew, rng, 3, 4, k) + honest_packets(crew2, rng, 2, 2, 8)
        rng.shuffle(packets) if rng.random() < 0.3 else None
        for i, (pkt, src) in enumerate(packets):
            compare(twins, pkt, src, now=i * 0.01)
        check_state(twins, len(packets) * 0.01)
    finally:
        twins.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), auth=st.sampled_from([AUTH_NONE, AUTH_MAC, AUTH_ENCRYPT]),
       keys=st.booleans())
def test_the_fuzz_mutator_gets_the_same_answers(seed, auth, keys):
    """Random, forged, replayed, bent packets and keyed rounds that go wrong (mismatches
    fail the job: the ERRORs, their rate limit and the failure text must agree)."""
    twins = Twins()
    try:
        job = twins.register(addresses(0, 3), 4, 16, auth)
        victim = twins.register(addresses(1, 2), 4, 16, AUTH_MAC)
        not_live = twins.register(addresses(2, 2), 1, 16, AUTH_MAC)
        twins.live(job)
        twins.live(victim)
        crew = Crew(job)
        mutator = Mutator(FuzzTarget(job.job_id, 3, 4, 16, 0,
                                     tuple(crew.channels) if keys else ()), seed)
        for i in range(400):
            datagram, rank = mutator.next()
            src = job.addresses[rank] if rank >= 0 else STRANGER
            if i % 7 == 0:
                src = not_live.addresses[0]
            compare(twins, datagram, src, now=i * 0.003)
        check_state(twins, 1.2)
    finally:
        twins.close()


def test_a_failed_job_answers_errors_alike():
    twins = Twins()
    try:
        job = twins.register(addresses(0, 2), 2, 8, AUTH_MAC)
        twins.live(job)
        crew = Crew(job)
        compare(twins, crew.data(0, [1, 2, 3], slot=0, seq=0, tsi=0), job.addresses[0], 0.0)
        out = compare(twins, crew.data(1, [1, 2], slot=0, seq=0, tsi=8), job.addresses[1], 0.0)
        assert len(out) == 1      # the ERROR to the rank that disagreed
        compare(twins, crew.data(0, [1], slot=1, seq=0), job.addresses[0], 0.05)   # limited
        compare(twins, crew.data(0, [1], slot=1, seq=1), job.addresses[0], 0.2)
        check_state(twins, 0.3)
        assert twins.core.info(job.job_id, 0.3).failure.startswith("rank 1 sent chunk")
    finally:
        twins.close()


def test_sums_are_exact_and_sealed_in_place():
    twins = Twins()
    try:
        job = twins.register(addresses(0, 4), 8, 1024, AUTH_MAC)
        twins.live(job)
        crew = Crew(job)
        rng = np.random.default_rng(1)
        for seq in range(6):
            values = rng.integers(-2**20, 2**20, (4, 1024), dtype=np.int32)
            for rank in range(4):
                out = compare(twins, crew.data(rank, values[rank], slot=seq % 8, seq=seq & 1),
                              job.addresses[rank], seq)
            assert len(out) == 4
            got = crew.values([(a, [d]) for a, d in out])
            assert all(v == values.sum(axis=0).tolist() for _, _, v in got)
    finally:
        twins.close()
