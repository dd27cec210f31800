"""The switch dataplane as a state machine, packet by packet."""

import numpy as np
import pytest

from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import JobTable, SwitchFull, multicast_group
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

W = [("10.0.0.1", 7000), ("10.0.0.2", 7000), ("10.0.0.3", 7000)]


@pytest.fixture
def dp():
    table = JobTable(16, 1024)
    plane = Dataplane(table)
    job = table.register(W, slots=4, k=8)
    plane.add_job(job)
    plane.job = job
    return plane


def data(dp, worker, values, slot=0, seq=0, tsi=0, exp=0, key=None, flags=0):
    hdr = Header(DATA, dp.job.job_id, worker, slot, len(values), seq, tsi, exp,
                 dp.job.key if key is None else key, flags)
    body = b"" if flags & PROBE else np.asarray(values, np.int32).tobytes()
    return encode(hdr, body)


def results(outputs):
    return [(addr, hdr, np.frombuffer(bytes(body), np.int32).tolist())
            for addr, hdr, body in outputs]


def test_sum_is_sent_to_every_worker_when_complete(dp):
    assert dp.on_datagram(data(dp, 0, [1, 2], exp=3), W[0]) == []
    assert dp.on_datagram(data(dp, 1, [10, 20], exp=5), W[1]) == []
    out = results(dp.on_datagram(data(dp, 2, [100, 200], exp=-1), W[2]))
    assert [a for a, _, _ in out] == W
    assert all(h.type == RESULT and h.exp == 5 and v == [111, 222] for _, h, v in out)
    assert dp.counters["completions"] == 1


def test_multicast_group_gets_one_result():
    table = JobTable(8, 64)
    plane = Dataplane(table)
    job = table.register(W, 2, 4, multicast_port=7000)
    plane.add_job(job)
    plane.job = job
    for w in range(3):
        out = plane.on_datagram(data(plane, w, [w]), W[w])
    assert [(a, h.type) for a, h, _ in out] == [((multicast_group(job.job_id), 7000), RESULT)]


def test_retransmission_of_complete_round_is_answered_by_unicast(dp):
    for w in range(3):
        dp.on_datagram(data(dp, w, [w + 1]), W[w])
    out = results(dp.on_datagram(data(dp, 1, [2]), W[1]))
    assert out == [(W[1], out[0][1], [6])] and dp.counters["retransmissions"] == 1


def test_retransmission_while_incomplete_gets_status_naming_the_missing(dp):
    dp.on_datagram(data(dp, 0, [1]), W[0])
    dp.on_datagram(data(dp, 2, [1]), W[2])
    (addr, hdr, body), = dp.on_datagram(data(dp, 0, [1]), W[0])
    assert addr == W[0] and hdr.type == STATUS and int.from_bytes(bytes(body), "little") == 0b010
    assert not hdr.flags & COMPLETE


def test_probes(dp):
    (_, hdr, body), = dp.on_datagram(data(dp, 0, [1], flags=PROBE), W[0])
    assert hdr.type == STATUS and bytes(body) == b"\x07"  # nothing yet: waiting for all
    for w in range(3):
        dp.on_datagram(data(dp, w, [5]), W[w])
    (_, hdr, _), = dp.on_datagram(data(dp, 0, [1], flags=PROBE), W[0])
    assert hdr.type == STATUS and hdr.flags & COMPLETE
    (_, hdr, body), = dp.on_datagram(data(dp, 0, [1], flags=PROBE | RESEND), W[0])
    assert hdr.type == RESULT and np.frombuffer(bytes(body), np.int32).tolist() == [15]
    assert dp.counters["completions"] == 1  # probes never contribute


def test_two_copies_alternate_and_stale_packets_are_dropped(dp):
    for seq, base in ((0, 1), (1, 10)):
        for w in range(3):
            out = dp.on_datagram(data(dp, w, [base], seq=seq), W[w])
        assert results(out)[0][2] == [3 * base]
    for w in (0, 1):  # workers 0 and 1 start round 2 (copy 0); worker 2 has not yet
        assert dp.on_datagram(data(dp, w, [100], seq=2), W[w]) == []
    # worker 2 lost round 1's result: its retransmission is answered from copy 1
    assert results(dp.on_datagram(data(dp, 2, [10], seq=1), W[2]))[0][2] == [30]
    # a late duplicate of round 1 from worker 0 (whose bit round 2 cleared) is stale
    assert dp.on_datagram(data(dp, 0, [999], seq=1), W[0]) == []
    # and so is a late round-0 packet: copy 0 now holds round 2
    assert dp.on_datagram(data(dp, 1, [999], seq=0), W[1]) == []
    assert dp.counters["drop_stale"] == 2
    out = dp.on_datagram(data(dp, 2, [100], seq=2), W[2])
    assert results(out)[0][2] == [300]


def test_new_round_before_previous_of_same_copy_completed_is_dropped(dp):
    dp.on_datagram(data(dp, 0, [1], seq=0), W[0])
    assert dp.on_datagram(data(dp, 1, [1], seq=2), W[1]) == []
    assert dp.counters["drop_out_of_order"] == 1


@pytest.mark.parametrize("make,reason", [
    (lambda dp: (data(dp, 0, [1], key=dp.job.key ^ 1), W[0]), "bad_key"),
    (lambda dp: (data(dp, 0, [1]), ("10.9.9.9", 7000)), "bad_source"),
    (lambda dp: (data(dp, 1, [1]), W[0]), "bad_source"),
    (lambda dp: (data(dp, 7, [1]), W[0]), "bad_source"),
    (lambda dp: (data(dp, 0, [1], slot=9), W[0]), "bad_slot"),
    (lambda dp: (data(dp, 0, list(range(9))), W[0]), "too_large"),
    (lambda dp: (b"\x00" * 40, W[0]), "foreign"),
    (lambda dp: (data(dp, 0, [1])[:20], W[0]), "truncated"),
    (lambda dp: (data(dp, 0, [1, 2])[:-4], W[0]), "length"),
    (lambda dp: (encode(Header(RESULT, 1, 0, 0, 0, 0, 0, 0, 0)), W[0]), "type"),
])
def test_bad_packets_are_dropped_and_counted(dp, make, reason):
    datagram, src = make(dp)
    assert dp.on_datagram(datagram, src) == []
    assert dp.counters[f"drop_{reason}"] == 1 and dp.counters["completions"] == 0


def test_disagreeing_workers_all_get_an_error(dp):
    dp.on_datagram(data(dp, 0, [1, 2], tsi=0), W[0])
    out = dp.on_datagram(data(dp, 1, [1, 2, 3], tsi=0), W[1])
    assert [a for a, _, _ in out] == W and all(h.type == ERROR for _, h, _ in out)
    assert b"tensors differ" in bytes(out[0][2])


def test_unknown_job_answers_rarely(dp):
    hdr = Header(DATA, 999, 0, 0, 0, 0, 0, 0, 0)
    first = dp.on_datagram(encode(Header(DATA, 999, 0, 0, 25, 0, 0, 0, 0), bytes(100)), W[0],
                           now=10.0)
    assert len(first) == 1 and first[0][1].type == ERROR
    assert bytes(first[0][2]).startswith(b"unknown job")
    assert dp.on_datagram(encode(hdr), W[0], now=10.01) == []  # rate-limited
    (_, _, body), = dp.on_datagram(encode(hdr), W[0], now=10.5)
    assert bytes(body) == b""  # never larger than what was received: no amplification


def test_jobs_get_disjoint_slots_and_free_them():
    table = JobTable(10, 64)
    a = table.register(W, 4, 8)
    b = table.register(W[:2], 6, 8)
    assert {a.slot_base, b.slot_base} == {0, 4} and a.key != b.key and a.job_id != b.job_id
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
    table = JobTable(4, 8)
    plane = Dataplane(table)
    job = table.register(W[:1], 1, 8)
    plane.add_job(job)
    plane.job = job
    (_, hdr, body), = plane.on_datagram(data(plane, 0, [7], tsi=40, exp=2), W[0])
    back, payload = decode(hdr.pack() + bytes(body))
    assert (back.tsi, back.exp, back.key, bytes(payload)) == (40, 2, job.key, bytes(body))
