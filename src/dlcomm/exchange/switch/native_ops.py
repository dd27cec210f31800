"""All-reduces through the native client (dlcomm.native.client), for the transport: dense
ones, and sparse rounds at threshold 0.

The transport's Python ops (sparse rounds with a threshold) and the native ones share one
socket, one set of
slot sequence numbers and, per shard, one packet counter and one pair of replay windows:
:class:`NativeOps` hands the Python channel's state to the native client before an op and
takes it back after, so a switch never sees a counter twice and a replayed packet is refused
whichever client runs. Failures are reported in window.py's words.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

import numpy as np

from dlcomm.errors import ExchangeError
from dlcomm.exchange.switch.timing import Timing
from dlcomm.exchange.switch.window import (
    Shard,
    no_answer_error,
    nonfinite_error,
    send_error,
    stuck_error,
    switch_error,
)
from dlcomm.native.client import (
    E_NONFINITE,
    E_PLAN,
    E_SOCKET,
    E_STUCK,
    E_SWITCH,
    Client,
    ShardKeys,
    WindowState,
)
from dlcomm.native.switch import MAX_NATIVE_WORKERS
from dlcomm.wire.auth import STREAM_DOWN, STREAM_RESULT, STREAM_UP, ReplayWindow
from dlcomm.wire.sparse import Presence

__all__ = ["NativeOps", "usable"]

SLICE_S = 0.2   # the control channel is looked at between slices (a dead peer, a failure)


def usable(workers: int, shards: list[Shard]) -> bool:
    """Whether the native client can run this job's dense rounds."""
    return workers <= MAX_NATIVE_WORKERS and len(shards) <= 16 and \
        len({sh.channel.mode for sh in shards}) == 1


def _material(shard: Shard, rank: int) -> bytes:
    m = shard.channel.keys.material
    return m[f"up {rank}"] + m[f"down {rank}"] + m["result"] if m else b""


class NativeOps:
    def __init__(self, fd: int, rank: int, workers: int, k: int, shards: list[Shard],
                 timing: Timing, drop_rate: float, seed: int, results_fd: int = -1) -> None:
        self.rank, self.shards, self.k = rank, shards, k
        self.client = Client(fd, rank, workers, k, shards[0].channel.mode,
                             [ShardKeys(sh.address, sh.job, sh.slots, _material(sh, rank))
                              for sh in shards],
                             timing.initial_timeout_s, timing.min_timeout_s,
                             timing.max_timeout_s, timing.deadline_s, drop_rate, seed,
                             results_fd)
        self.seen = dict.fromkeys(("packets_sent", "bytes_sent", "packets_received",
                                   "bytes_received", "retransmissions", "probes", "rejected",
                                   "drops_injected"), 0)

    def close(self) -> None:
        self.client.close()

    def _window(self, shard: Shard, key: tuple[int, int]) -> ReplayWindow:
        windows = shard.channel.windows
        if key not in windows:
            windows[key] = ReplayWindow()
        return windows[key]

    def _hand_over(self, seqs: list[list[int]]) -> None:
        for i, sh in enumerate(self.shards):
            res = self._window(sh, (STREAM_RESULT, -1))
            down = self._window(sh, (STREAM_DOWN, self.rank))
            up_next = sh.channel.sent.get((STREAM_UP, self.rank), -1) + 1
            self.client.set_state(i, up_next, WindowState(res.highest, res.bits),
                                  WindowState(down.highest, down.bits), seqs[i])

    def _take_back(self, seqs: list[list[int]]) -> None:
        for i, sh in enumerate(self.shards):
            up_next, res, down, slot_seqs = self.client.get_state(i)
            if up_next:
                sh.channel.sent[(STREAM_UP, self.rank)] = up_next - 1
            for key, state in (((STREAM_RESULT, -1), res), ((STREAM_DOWN, self.rank), down)):
                window = self._window(sh, key)
                window.highest, window.bits = state.highest, state.bits
            seqs[i][:] = slot_seqs

    def run(self, data: np.ndarray, seqs: list[list[int]],
            failure: Callable[[], str | None], control_failure: Callable[[], str | None],
            sparse_block: int = 0, presence: Presence | None = None,
            count_block: int = 0) -> dict[str, int]:
        """Sum ``data`` in place (``sparse_block``: in sparse rounds of blocks of that size,
        with the tensor's ``presence`` if known; ``count_block``: dense, counting the result's
        blocks of that size that hold data, :meth:`union_blocks`); the counters it moved."""
        self._hand_over(seqs)
        try:
            t0 = time.perf_counter()
            if sparse_block:
                if self.k % sparse_block:
                    raise ExchangeError(f"sparse block {sparse_block} must divide k = {self.k}")
                known = presence if presence is not None and presence.block == sparse_block \
                    and len(presence.present) == -(-len(data) // sparse_block) else None
                self.client.begin_sparse(data, sparse_block, time.monotonic(),
                                         known.present if known else None,
                                         known.negative_zero if known else None)
            else:
                self.client.count_blocks(count_block)
                self.client.begin(data, time.monotonic())
            self.client.allow_skew(time.perf_counter() - t0)
            while True:
                state = self.client.run(SLICE_S)
                if state == 1:
                    break
                reason = failure()
                if reason:
                    raise ExchangeError(reason)
                if state == -1:
                    error = self._error()
                    reason = control_failure()
                    if reason:
                        raise ExchangeError(reason) from error
                    raise error
        finally:
            self._take_back(seqs)
        return self._moved()

    def union_blocks(self) -> int:
        return self.client.union_blocks()

    def _moved(self) -> dict[str, int]:
        now = self.client.stats()
        moved = {k: now[k] - self.seen[k] for k in now}
        self.seen = now
        return moved

    def _error(self) -> ExchangeError:
        err = self.client.error(time.monotonic())
        assert err is not None
        addr = self.shards[err.shard].address
        if err.kind == E_SWITCH:
            return switch_error(addr, err.text)
        if err.kind == E_PLAN:
            return ExchangeError(err.text.decode(errors="replace"))
        if err.kind == E_SOCKET and err.element == errno.EBADF:
            return ExchangeError("a socket of this worker was closed under the all-reduce")
        if err.kind == E_SOCKET:
            return send_error(addr, os.strerror(err.element))
        if err.kind == E_NONFINITE:
            return nonfinite_error(self.rank, err.element if err.element >= 0 else None)
        if err.kind == E_STUCK:
            return stuck_error(addr, err.idle_s, err.missing, err.slot, err.seq)
        return no_answer_error(addr, err.idle_s)
