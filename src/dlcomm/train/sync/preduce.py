"""Partial All-Reduce (Prague's P-Reduce): the members of a group replace their models by
the group's average. Two implementations (the ``impl=`` option of ``prague``):

- ``dist`` (default): one gloo process group per distinct group, created by its members
  the first time they meet in it (rendezvous on the job's own TCPStore under a key that
  names the members, so non-members take no part) and kept for later meetings; the
  average is gloo's all-reduce within it. Bytes are modelled as the ring's
  2 (g - 1) / g of the model per member.
- ``switch``: through dlcomm's aggregation switch, one switch job per group, so that a
  slot aggregates exactly the group's members (``--exchange switch``, which ``dlcomm
  train`` starts). Jobs are registered at start-up, so the groups must be known then:
  this implementation takes the ``static`` schedule's groups. Bytes are measured on the
  switch exchange's sockets.
"""

from __future__ import annotations

import abc
import datetime
from typing import Any

import torch
import torch.distributed as dist

from dlcomm.errors import ConfigError, ExchangeError
from dlcomm.exchange import ExchangeContext, make_exchange
from dlcomm.exchange.base import Exchange
from dlcomm.registry import parse_spec
from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.sync.recorder import job_store
from dlcomm.volume import ring_allreduce_bytes

__all__ = ["PartialAllReduce", "GlooGroups", "SwitchGroups"]


class PartialAllReduce(abc.ABC):
    counting = "modelled"

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.bytes_received = 0
        self.calls = 0

    @abc.abstractmethod
    def average(self, members: tuple[int, ...], flat: torch.Tensor) -> torch.Tensor:
        """The mean of ``flat`` over ``members`` (this worker among them)."""

    def counters(self) -> tuple[int, int]:
        return self.bytes_sent, self.bytes_received

    def close(self) -> None:
        """Release groups and sockets."""


class GlooGroups(PartialAllReduce):
    """A gloo process group per distinct group, created lazily by its members."""

    def close(self) -> None:
        self.groups.clear()

    def __init__(self, env: WorkerEnv, timeout_s: float) -> None:
        super().__init__()
        self.rank = env.rank
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.store = job_store(env, timeout_s)
        self.groups: dict[tuple[int, ...], Any] = {}

    def _group(self, members: tuple[int, ...]) -> Any:
        if members not in self.groups:
            prefix = dist.PrefixStore(f"dlcomm-prague/{'-'.join(map(str, members))}/",
                                      self.store)
            self.groups[members] = dist.ProcessGroupGloo(prefix, members.index(self.rank),
                                                         len(members), self.timeout)
        return self.groups[members]

    def average(self, members: tuple[int, ...], flat: torch.Tensor) -> torch.Tensor:
        try:
            self._group(members).allreduce([flat]).wait()
        except Exception as exc:  # a member died or never came
            raise ExchangeError(f"prague: rank {self.rank}: P-Reduce with ranks "
                                f"{list(members)} failed: {str(exc).splitlines()[0]}") from exc
        moved = ring_allreduce_bytes(flat.numel() * flat.element_size(), len(members))
        self.bytes_sent += moved
        self.bytes_received += moved
        self.calls += 1
        return flat / len(members)


class SwitchGroups(PartialAllReduce):
    """One aggregation-switch job per group; every rank registers the groups in order."""

    counting = "measured"

    def __init__(self, env: WorkerEnv, exchange_spec: str, groups: list[tuple[int, ...]],
                 job_name: str) -> None:
        super().__init__()
        if parse_spec(exchange_spec).name != "switch":
            raise ConfigError("prague impl=switch aggregates through the switch: use "
                              "--exchange switch (dlcomm train starts one) or "
                              "--exchange switch:addr=HOST:PORT")
        self.rank = env.rank
        self.exchanges: dict[tuple[int, ...], Exchange] = {}
        try:
            for index, members in enumerate(groups):
                pg = dist.new_group(list(members))   # every rank, same order
                if env.rank not in members:
                    continue
                ctx = ExchangeContext(members.index(env.rank), len(members), group=pg,
                                      job_name=f"{job_name}-g{index}")
                self.exchanges[members] = make_exchange(exchange_spec, ctx)
        except BaseException:
            self.close()
            raise

    def average(self, members: tuple[int, ...], flat: torch.Tensor) -> torch.Tensor:
        exchange = self.exchanges.get(members)
        if exchange is None:
            raise ExchangeError(f"prague: no switch job for group {list(members)} "
                                "(impl=switch serves the static schedule's groups)")
        total = exchange.allreduce(flat).wait()
        self.calls += 1
        return total / len(members)

    def counters(self) -> tuple[int, int]:
        stats = [e.stats() for e in self.exchanges.values()]
        return sum(s.bytes_sent for s in stats), sum(s.bytes_received for s in stats)

    def close(self) -> None:
        for exchange in self.exchanges.values():
            exchange.close()
        self.exchanges.clear()
