"""Small values among a group's ranks through the job's store, not through collectives.

An exchange's bootstrap swaps host addresses, ports and tickets among its ranks
(:class:`~dlcomm.exchange.base.ObjectCollectives`). Usually torch's object collectives do it;
the dlcomm c10d backend cannot use them while ``init_process_group`` is still creating it,
so it hands the bootstrap a :class:`StoreObjects` over the group's rendezvous store (the
store every torch launcher already provides, trusted as much as torch trusts it: values are
pickled, exactly as ``all_gather_object`` pickles them).

A rank that fails while the others wait for it says so in the store (:meth:`fail`): they
raise its reason at once instead of waiting out the timeout.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from dlcomm.errors import ExchangeError

__all__ = ["StoreObjects", "GroupObjects"]

POLL_S = 0.01


class GroupObjects:
    """:class:`~dlcomm.exchange.base.ObjectCollectives` as torch's object collectives on
    ``group`` (None: the default group), for exchanges built after ``init_process_group``."""

    def __init__(self, group: dist.ProcessGroup | None, world_size: int) -> None:
        self.group = group
        self.world_size = world_size

    def all_gather(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def broadcast_from_first(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]


class StoreObjects:
    """:class:`~dlcomm.exchange.base.ObjectCollectives` over a ``torch.distributed.Store``."""

    def __init__(self, store: Store, rank: int, world_size: int, timeout_s: float,
                 prefix: str = "dlcomm/objects") -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.prefix = prefix
        self._calls = 0

    def _tag(self) -> str:
        self._calls += 1
        return f"{self.prefix}/{self._calls}"

    def _put(self, key: str, data: bytes) -> None:
        self.store.set(key, data)  # type: ignore[arg-type]  # (stubs: the binding takes bytes)

    def all_gather(self, value: Any) -> list[Any]:
        tag = self._tag()
        self._put(f"{tag}/{self.rank}", pickle.dumps(value))
        return [value if r == self.rank else pickle.loads(self._get(f"{tag}/{r}", r))
                for r in range(self.world_size)]

    def broadcast_from_first(self, value: Any) -> Any:
        tag = self._tag()
        if self.rank == 0:
            self._put(f"{tag}/0", pickle.dumps(value))
            return value
        return pickle.loads(self._get(f"{tag}/0", 0))

    def fail(self, reason: str) -> None:
        """Tell the ranks waiting on this one why it gave up (first reason kept)."""
        key = f"{self.prefix}/failed"
        self.store.compare_set(key, "", f"rank {self.rank}: {reason}")

    def _failure(self) -> str | None:
        key = f"{self.prefix}/failed"
        if self.store.check([key]):
            return bytes(self.store.get(key)).decode(errors="replace")
        return None

    def _get(self, key: str, rank: int) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.store.check([key]):
                return bytes(self.store.get(key))
            failure = self._failure()
            if failure:
                raise ExchangeError(failure)
            if time.monotonic() > deadline:
                raise ExchangeError(f"rank {rank} did not answer within {self.timeout_s:g} s "
                                    "(dead, or not in the same job)")
            time.sleep(POLL_S)

    def arrive(self, name: str) -> None:
        """Say that this rank reached ``name`` (see :meth:`missing`)."""
        self.store.set(f"{self.prefix}/{name}/{self.rank}", "1")

    def missing(self, name: str, timeout_s: float) -> list[int]:
        """The ranks that have not reached ``name`` after waiting up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        waiting = list(range(self.world_size))
        while True:
            waiting = [r for r in waiting
                       if not self.store.check([f"{self.prefix}/{name}/{r}"])]
            if not waiting or time.monotonic() > deadline:
                return waiting
            time.sleep(POLL_S)
