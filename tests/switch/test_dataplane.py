"""The switch dataplane as a state machine, packet by packet (authenticated packets)."""

import numpy as np
import pytest

from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import JobTable, SwitchFull
from dlcomm.wire.auth import AUTH_ENCRYPT, AUTH_NONE
from dlcomm.wire.packet import (
    COMPLETE,
    DATA,
    ERROR,
    PROBE,
    RESEND,
    RESULT,
    STATUS,
    Header,
    decode,
    encode,
)
from tests.switch.crew import Crew, size_of

W = [("10.0.0.1", 7000), ("10.0.0.2", 7000), ("10.0.0.3", 7000)]


def _flip_last(datagram: bytes) -> bytes:
    """The datagram with its tag's last byte changed (a fixed byte would be the tag's own
    one time in 256)."""
    return datagram[:-1] + bytes([datagram[-1] ^ 1])


def make_plane(workers=W, slots=4, k=8, total=16, **kw):
    table = JobTable(total, max(k, 8))
    plane = Dataplane(table)
    job = table.register(workers, slots=slots, k=k, **kw)
    job.live = True
    plane.add_job(job)
    return plane, Crew(job)


@pytest.fixture
def dp():
    return make_plane()


def test_sum_is_sent_to_every_worker_when_complete(dp):
    plane, crew = dp
    assert plane.on_datagram(crew.data(0, [1, 2], exp=3), W[0]) == []
    assert plane.on_datagram(crew.data(1, [10, 20], exp=5), W[1]) == []
    out = crew.values(plane.on_datagram(crew.data(2, [100, 200], exp=-1), W[2]))
    assert [a for a, _, _ in out] == W
    assert all(h.type == RESULT and h.exp == 5 and v == [111, 222] for _, h, v in out)
    assert plane.counters["completions"] == 1


@pytest.mark.parametrize("auth", [AUTH_NONE, AUTH_ENCRYPT])
def test_other_protection_modes_sum_alike(auth):
    plane, crew = make_plane(auth=auth)
    for w in range(3):
        out = plane.on_datagram(crew.data(w, [w + 1, 7]), W[w])
    assert [v for _, _, v in crew.values(out)] == [[6, 21]] * 3


def test_multicast_group_gets_one_result():
    plane, crew = make_plane(slots=2, k=4, total=8, multicast_port=7000)
    group = crew.job.group
    assert group is not None and group[0].startswith("239.")
    for w in range(3):
        out = plane.on_datagram(crew.data(w, [w]), W[w])
    assert [(a, h.type) for a, h, _ in crew.read(out)] == [(group, RESULT)]


def test_multicast_groups_are_not_predictable():
    table = JobTable(64, 8)
    groups = {table.register(W, 1, 8, multicast_port=7000).group[0] for _ in range(20)}
    assert len(groups) == 20  # random, distinct: not 239.77.<job number>


def test_retransmission_of_complete_round_is_answered_by_unicast(dp):
    plane, crew = dp
    for w in range(3):
        plane.on_datagram(crew.data(w, [w + 1]), W[w])
    out = crew.values(plane.on_datagram(crew.data(1, [2]), W[1]))
    assert out == [(W[1], out[0][1], [6])] and plane.counters["retransmissions"] == 1


def test_retransmission_while_incomplete_gets_status_naming_the_missing(dp):
    plane, crew = dp
    plane.on_datagram(crew.data(0, [1]), W[0])
    plane.on_datagram(crew.data(2, [1]), W[2])
    (addr, hdr, body), = crew.read(plane.on_datagram(crew.data(0, [1]), W[0]))
    assert addr == W[0] and hdr.type == STATUS and int.from_bytes(body, "little") == 0b010
    assert not hdr.flags & COMPLETE


def test_probes(dp):
    plane, crew = dp
    (_, hdr, body), = crew.read(plane.on_datagram(crew.data(0, [1], flags=PROBE), W[0]))
    assert hdr.type == STATUS and body == b"\x07"  # nothing yet: waiting for all
    for w in range(3):
        plane.on_datagram(crew.data(w, [5]), W[w])
    (_, hdr, _), = crew.read(plane.on_datagram(crew.data(0, [1], flags=PROBE), W[0]))
    assert hdr.type == STATUS and hdr.flags & COMPLETE
    (_, hdr, body), = crew.values(plane.on_datagram(crew.data(0, [1], flags=PROBE | RESEND),
                                                    W[0]))
    assert hdr.type == RESULT and body == [15]
    assert plane.counters["completions"] == 1  # probes never contribute


def test_no_answer_is_larger_than_its_question(dp):
    """A probe that does not pad itself to its answer gets none: the switch cannot amplify."""
    plane, crew = dp
    for w in range(3):
        plane.on_datagram(crew.data(w, [5, 6, 7, 8]), W[w])
    small = crew.data(0, [1, 2, 3, 4], flags=PROBE | RESEND, pad=0)
    assert plane.on_datagram(small, W[0]) == []
    assert plane.counters["drop_answer_too_large"] == 1
    asked = crew.data(0, [1, 2, 3, 4], flags=PROBE | RESEND)
    out = plane.on_datagram(asked, W[0])
    assert size_of(out) == [len(asked)]


def test_two_copies_alternate_and_stale_packets_are_dropped(dp):
    plane, crew = dp
    for seq, base in ((0, 1), (1, 10)):
        for w in range(3):
            out = plane.on_datagram(crew.data(w, [base], seq=seq), W[w])
        assert crew.values(out)[0][2] == [3 * base]
    for w in (0, 1):  # workers 0 and 1 start round 2 (copy 0); worker 2 has not yet
        assert plane.on_datagram(crew.data(w, [100], seq=2), W[w]) == []
    # worker 2 lost round 1's result: its retransmission is answered from copy 1
    assert crew.values(plane.on_datagram(crew.data(2, [10], seq=1), W[2]))[0][2] == [30]
    # a late duplicate of round 1 from worker 0 (whose bit round 2 cleared) is stale
    assert plane.on_datagram(crew.data(0, [999], seq=1), W[0]) == []
    # and so is a late round-0 packet: copy 0 now holds round 2
    assert plane.on_datagram(crew.data(1, [999], seq=0), W[1]) == []
    assert plane.counters["drop_stale"] == 2
    out = plane.on_datagram(crew.data(2, [100], seq=2), W[2])
    assert crew.values(out)[0][2] == [300]


def test_new_round_before_previous_of_same_copy_completed_is_dropped(dp):
    plane, crew = dp
    plane.on_datagram(crew.data(0, [1], seq=0), W[0])
    assert plane.on_datagram(crew.data(1, [1], seq=2), W[1]) == []
    assert plane.counters["drop_out_of_order"] == 1


def test_a_sequence_jump_cannot_jam_a_slot(dp):
    """seq 0xFFFFFFFF (or any jump) from a job member starts no round: the slot goes on."""
    plane, crew = dp
    for w in range(3):
        plane.on_datagram(crew.data(w, [1], seq=0), W[w])
    assert plane.on_datagram(crew.data(0, [1], seq=0xFFFFFFFE), W[0]) == []
    assert plane.on_datagram(crew.data(1, [1], seq=6), W[1]) == []
    for w in range(3):
        out = plane.on_datagram(crew.data(w, [2], seq=2), W[w])
    assert crew.values(out)[0][2] == [6]


@pytest.mark.parametrize("make,reason", [
    (lambda c: (_flip_last(c.data(0, [1])), W[0]), "bad_tag"),
    (lambda c: (c.data(0, [1]), ("10.9.9.9", 7000)), "bad_source"),
    (lambda c: (c.data(1, [1]), W[0]), "bad_source"),
    (lambda c: (c.data(7, [1]), W[0]), "bad_source"),
    (lambda c: (c.data(0, [1], slot=9), W[0]), "bad_slot"),
    (lambda c: (c.data(0, list(range(9))), W[0]), "too_large"),
    (lambda c: (c.data(0, [1], exp=129), W[0]), "bad_exponent"),
    (lambda c: (c.data(0, [2**30]), W[0]), "bad_value"),
    (lambda c: (b"\x00" * 40, W[0]), "foreign"),
    (lambda c: (c.data(0, [1])[:20], W[0]), "truncated"),
    (lambda c: (c.packet(Header(DATA, c.job.job_id, 0, 0, 2, 0, 0, 0), bytes(4)), W[0]),
     "length"),
    (lambda c: (c.packet(Header(RESULT, c.job.job_id, 0, 0, 0, 0, 0, 0)), W[0]), "type"),
])
def test_bad_packets_are_dropped_and_counted(dp, make, reason):
    plane, crew = dp
    datagram, src = make(crew)
    assert plane.on_datagram(datagram, src) == []
    assert plane.counters[f"drop_{reason}"] == 1 and plane.counters["completions"] == 0


def test_a_replayed_packet_is_refused(dp):
    plane, crew = dp
    packet = crew.data(0, [1])
    plane.on_datagram(packet, W[0])
    assert plane.on_datagram(packet, W[0]) == []
    assert plane.counters["drop_replay"] == 1


def test_a_job_that_is_not_live_takes_no_packet(dp):
    plane, crew = dp
    crew.job.live = False
    assert plane.on_datagram(crew.data(0, [1]), W[0]) == []
    assert plane.counters["drop_not_live"] == 1


def test_disagreeing_workers_fail_the_job_with_one_error_to_the_sender(dp):
    plane, crew = dp
    plane.on_datagram(crew.data(0, [1, 2], tsi=0), W[0])
    sent = crew.data(1, [1, 2, 3], tsi=0)
    out = plane.on_datagram(sent, W[1], now=1.0)
    (addr, hdr, body), = crew.read(out)
    assert addr == W[1] and hdr.type == ERROR and size_of(out)[0] <= len(sent)
    assert plane.failures and "tensors differ" in plane.failures[0][1]
    assert body and plane.failures[0][1].encode().startswith(bytes(body))  # cut to fit
    # every later packet of the job: at most one ERROR per worker per interval
    assert crew.read(plane.on_datagram(crew.data(2, [1, 2]), W[2], now=1.0))[0][1].type == ERROR
    assert plane.on_datagram(crew.data(2, [1, 2], seq=1), W[2], now=1.01) == []


def test_unknown_job_gets_no_answer(dp):
    plane, _ = dp
    datagram = encode(Header(DATA, 999, 0, 0, 25, 0, 0, 0), bytes(100))
    assert plane.on_datagram(datagram, W[0], now=10.0) == []
    assert plane.counters["drop_unknown_job"] == 1


def test_jobs_get_disjoint_slots_and_free_them():
    table = JobTable(10, 64)
    a = table.register(W, 4, 8)
    b = table.register(W[:2], 6, 8)
    assert {a.slot_base, b.slot_base} == {0, 4} and a.secret != b.secret
    assert a.job_id != b.job_id
    with pytest.raises(SwitchFull):
        table.register(W, 1, 8)
    table.remove(a.job_id)
    c = table.register(W, 3, 8)
    assert c.slot_base == 0 and table.slots_in_use() == 9
    with pytest.raises(ValueError, match="same address"):
        table.register([W[0], W[0]], 1, 8)
    with pytest.raises(ValueError, match="k must be"):
        table.register(W, 1, 65)
    assert table.idle(now=1e6, timeout_s=10) == [b.job_id, c.job_id]


def test_decoded_result_header():
    plane, crew = make_plane(workers=W[:1], slots=1, total=4)
    out = plane.on_datagram(crew.data(0, [7], tsi=40, exp=2), W[0])
    (_, hdr, body), = crew.read(out)
    assert (hdr.tsi, hdr.exp, np.frombuffer(body, np.int32).tolist()) == (40, 2, [7])
    plane, crew = make_plane(workers=W[:1], slots=1, total=4, auth=AUTH_NONE)
    (_, parts), = plane.on_datagram(crew.data(0, [7], tsi=40, exp=2), W[0])
    back, payload = decode(b"".join(bytes(p) for p in parts))
    assert (back.tsi, back.exp, bytes(payload)) == (40, 2, np.int32(7).tobytes())
