"""The compressed exchange's direct path: an uncompressed call issued on the caller's thread.

On a fast network the adaptive policy keeps every bucket uncompressed, and the wrapper's
own thread (two hand-overs per bucket: to it and back) was its whole cost: 1.08x per step
on two cores (docs/compression.md). A call takes the direct path when, on this worker,

1. no job is queued or running on the exchange thread and no direct call is in flight
   (so every earlier call's collectives have been issued, and the policy's state is what
   the exchange thread would see: the policy is never used by two threads at once);
2. the policy asks no trials for it (else the job goes to the thread before ``choose``,
   so the trials' collectives come first, as on the thread);
3. the policy's choice is a lossless method without warm-up and the error-feedback memory
   holds nothing for the tensor: then the call is exactly one in-place sum through the
   inner exchange, which is started here; its completion (on the inner exchange's thread)
   records the call for the policy and only then completes the caller's future.

Otherwise the job, with what was already asked of the policy, goes to the exchange thread,
which waits for direct calls in flight before it uses the policy. Either way a worker
issues the same collectives in the same order as on the thread alone (choose, and with it
a decision's all-reduce, then the call's own), so workers that take different paths for
the same call stay in step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from dlcomm.compress.base import Compressor
from dlcomm.exchange.compressed.policy import CallRecord

__all__ = ["DirectPath"]


class DirectPath:
    """Who may use the policy now: counts of thread jobs and direct calls in flight."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.jobs = 0            # queued or running on the exchange thread
        self.in_flight = 0       # direct calls not yet recorded
        self.direct_calls = 0

    def try_enter(self) -> bool:
        """Condition 1; on success the caller owns the policy until it hands over."""
        with self.cond:
            if self.jobs or self.in_flight:
                return False
            self.in_flight += 1
            return True

    def to_thread(self, enqueue: Callable[[], None]) -> None:
        """Hand a job to the exchange thread (counted before it can start)."""
        with self.cond:
            self.jobs += 1
        enqueue()

    def release(self) -> None:
        with self.cond:
            self.in_flight -= 1
            self.cond.notify_all()

    def job_done(self) -> None:
        with self.cond:
            self.jobs -= 1

    def wait_clear(self, timeout: float | None = None) -> bool:
        """The exchange thread: wait until no direct call is in flight."""
        with self.cond:
            return self.cond.wait_for(lambda: self.in_flight == 0, timeout)

    def plain(self, compressor: Compressor, iteration: int, holds: bool) -> bool:
        """Condition 3."""
        return compressor.lossless and compressor.summable and not holds and \
            iteration >= compressor.warmup_iterations

    def start(self, inner: Any, flat: torch.Tensor, rec: CallRecord,
              finish: Callable[[CallRecord, torch.Tensor | None, BaseException | None], None]
              ) -> None:
        """Sum ``flat`` in place through ``inner``; on completion ``finish(rec, total,
        error)``, which records the call and then :meth:`release` s the policy."""
        self.direct_calls += 1
        before = inner.stats().bytes_sent
        t0 = time.perf_counter()

        def done(fut: torch.futures.Future[torch.Tensor]) -> None:
            try:
                total, error = fut.value(), None
            except BaseException as exc:  # carried to the caller's future
                total, error = None, exc
            seconds = time.perf_counter() - t0
            moved = inner.stats().bytes_sent - before
            rec.comm_s += seconds
            rec.wire_bytes += moved
            rec.collectives.append((moved, seconds))
            finish(rec, total, error)
        inner.allreduce(flat, None).add_done_callback(done)   # a raise: the caller releases
