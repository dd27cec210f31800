"""Small values among ranks through a store: the c10d backend's bootstrap channel."""

import threading

import pytest
import torch.distributed as dist

from dlcomm.errors import ExchangeError
from dlcomm.exchange.objects import StoreObjects


def ranks(world, body, timeout_s=5.0):
    """Run body(objects) on ``world`` threads sharing one store; results by rank."""
    store = dist.HashStore()
    out, errors = [None] * world, [None] * world

    def run(rank):
        try:
            out[rank] = body(StoreObjects(store, rank, world, timeout_s))
        except Exception as exc:  # noqa: BLE001 (handed to the test)
            errors[rank] = exc
    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out, errors


def test_all_gather_and_broadcast_in_order():
    def body(objects):
        first = objects.all_gather({"rank": objects.rank, "addr": ("10.0.0.1", objects.rank)})
        second = objects.broadcast_from_first(f"from {objects.rank}")
        third = objects.all_gather(objects.rank * 10)
        return first, second, third
    out, errors = ranks(4, body)
    assert errors == [None] * 4
    for first, second, third in out:
        assert [v["addr"] for v in first] == [("10.0.0.1", r) for r in range(4)]
        assert second == "from 0" and third == [0, 10, 20, 30]


def test_a_failing_rank_fails_the_waiting_ones_at_once_with_its_reason():
    def body(objects):
        if objects.rank == 0:
            objects.fail("cannot reach the switch at 127.0.0.1:9")
            raise ExchangeError("gave up")
        return objects.broadcast_from_first(None)
    out, errors = ranks(3, body, timeout_s=20)
    for err in errors[1:]:
        assert isinstance(err, ExchangeError)
        assert str(err) == "rank 0: cannot reach the switch at 127.0.0.1:9"


def test_a_silent_rank_times_out_naming_it():
    def body(objects):
        if objects.rank == 1:
            return None
        return objects.all_gather(1)
    out, errors = ranks(2, body, timeout_s=0.3)
    with pytest.raises(ExchangeError, match="rank 1 did not answer within 0.3 s"):
        raise errors[0]


def test_missing_ranks_at_a_meeting_point():
    def body(objects):
        if objects.rank != 2:
            objects.arrive("left")
        return objects.missing("left", 0.3)
    out, _ = ranks(3, body)
    assert all(m == [2] for m in out)
