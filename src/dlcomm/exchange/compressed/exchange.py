"""``compressed``: any exchange wrapped with a Compressor and a Memory (error feedback).

``CompressedExchange.allreduce(flat, key)`` keeps the sum semantics of every exchange (the
DDP hook divides by the world size afterwards). One call, on the exchange's own thread (so
compression overlaps backward, and every worker issues its collectives in bucket order):

1. p = memory.compensate(flat) (skipped in iterations 0 and 1, whose DDP buckets are not
   final, and while a method warms up uncompressed);
2. by the method's flags:
   - summable: run its rounds (sans-I/O generator, base.py); each "sum" round goes through
     the inner exchange's all-reduce in its wire form: float32 as is; float16/bfloat16 as
     such where the inner exchange sums them natively (the ring), else as exact float32
     values; integer levels packed several to a word (packing.py): int32 words on the ring,
     float32 words below 2^24 on float-only exchanges such as the aggregation switch;
     a "max" round (an agreed scale) is one small torch.distributed all-reduce;
   - sparse, and the inner exchange is sparse (``sparse-switch`` or ``auto``):
     the decompressed tensor, zeros included, is summed by the inner exchange;
   - otherwise: all-gather of the exact payload bytes (allgather.py) and accumulation of
     the peers' decompressed payloads into one tensor (sum, or majority vote of signs);
3. memory.update(p, local, average); the sum is written into ``flat``.

Bytes: the inner exchange's own counts for what went through it (measured on the switch,
modelled on the ring), plus this wrapper's exact payload counts for all-gathers and small
control all-reduces (modelled, from the algorithm).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dlcomm.compress.base import Compressor, Memory, Outcome, Protocol, Round
from dlcomm.compress.packing import (
    check_world,
    decode_payload,
    encode_payload,
    pack_lanes,
    unpack_lane_sums,
)
from dlcomm.errors import ExchangeError
from dlcomm.exchange.base import Capabilities, Exchange, ExchangeContext, ExchangeStats
from dlcomm.exchange.compressed.allgather import GatherCount, allgather_bytes
from dlcomm.exchange.compressed.direct import DirectPath
from dlcomm.exchange.compressed.policy import STABLE_ITERATION, CallRecord, Policy
from dlcomm.volume import ring_allreduce_bytes
from dlcomm.wire.sparse import Presence

__all__ = ["CompressedExchange", "check_world"]  # check_world: compress/packing.py

@dataclass
class _Job:
    flat: torch.Tensor
    record: CallRecord
    shapes: list[torch.Size] | None
    future: torch.futures.Future[torch.Tensor]
    begun: bool = False  # what the direct path asked already (direct.py): trials, choice
    trials: list[Compressor] | None = None
    chosen: Compressor | None = None


_STOP = object()


class CompressedExchange(Exchange):
    """Wraps ``inner``: compress, exchange, decompress, error feedback (module docstring)."""

    name = "compressed"
    capabilities = Capabilities(layout=True)

    def __init__(self, inner: Exchange, policy: Policy, memory: Memory, ctx: ExchangeContext,
                 spec: dict[str, str]) -> None:
        super().__init__(ctx, counting=inner.stats().counting)
        self.inner, self.policy, self.memory, self.spec = inner, policy, memory, spec
        self.native, self.sparse_inner = inner.capabilities.native_dtypes, inner.capabilities.sparse
        self.word = torch.int32 if self.native else torch.float32
        for c in policy.compressors():
            c.bind(ctx.rank, ctx.world_size)
            check_world(c, max(ctx.world_size, 1), self.word)  # fails early, one line
        self.warmup_iterations = max((c.warmup_iterations for c in policy.compressors()), default=0)
        self.layouts: dict[Any, list[torch.Size]] = {}
        self.gathered = GatherCount()
        self.dense_bytes = 0                          # float32 bytes handed to this exchange
        self.totals = {"compress_s": 0.0, "comm_s": 0.0, "calls_exact": 0}
        self.records: list[CallRecord] = []          # of the current iteration
        self.iteration = 0
        self._seen: set[tuple[Any, int]] = set()
        self._failure: BaseException | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self.direct = DirectPath()
        self._thread = threading.Thread(target=self._serve, name="dlcomm-compress", daemon=True)
        self._thread.start()

    # -- the Exchange interface -------------------------------------------------------------

    def set_layout(self, key: int | str | None, shapes: list[torch.Size]) -> None:
        """The parameter shapes of the tensor named ``key`` (PowerSGD compresses per matrix)."""
        self.layouts[key] = list(shapes)

    def allreduce(self, flat: torch.Tensor, key: int | str | None = None,
                  presence: Presence | None = None) -> torch.futures.Future[torch.Tensor]:
        if self._failure is not None:
            raise ExchangeError(f"compressed exchange failed earlier: {self._failure}")
        if flat.dtype != torch.float32:
            raise ExchangeError(f"the compressed exchange takes float32 tensors, got {flat.dtype}")
        ident = (key, flat.numel())
        if ident in self._seen:  # the same tensor again: a new iteration has begun
            self.iteration += 1
            self._seen.clear()
        self._seen.add(ident)
        s = self._stats
        s.calls += 1
        s.elements += flat.numel()
        self.dense_bytes += flat.numel() * 4
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        record = CallRecord(f"{key}:{flat.numel()}", flat.numel(), self.iteration, "",
                            submitted=time.perf_counter())
        job = _Job(flat, record, self.layouts.get(key), fut)
        if self.direct.try_enter():
            self._direct(job)
        else:
            self.direct.to_thread(lambda: self._queue.put(job))
        return fut

    def _direct(self, job: _Job) -> None:
        """Uncompressed on the caller's thread, or to the exchange thread (direct.py)."""
        rec = job.record
        try:
            self._begin(rec)
            job.begun = True
            job.trials = self.policy.trials(rec.name, rec.numel, rec.iteration)
            if not job.trials:
                rec.started = time.perf_counter()
                job.chosen = self.policy.choose(rec.name, rec.numel, rec.iteration)
                if self.direct.plain(job.chosen, rec.iteration, self.memory.holds(rec.name)):
                    rec.method = job.chosen.name
                    self.direct.start(self.inner, job.flat, rec,
                                      lambda r, total, err: self._direct_done(job, total, err))
                    return
        except BaseException:
            self.direct.release()
            raise
        self.direct.to_thread(lambda: self._queue.put(job))
        self.direct.release()

    def _direct_done(self, job: _Job, total: torch.Tensor | None,
                     error: BaseException | None) -> None:
        rec = job.record
        try:
            if error is None and total is not None:
                if total.data_ptr() != job.flat.data_ptr():
                    job.flat.copy_(total)
                rec.finished = time.perf_counter()
                self.totals["comm_s"] += rec.comm_s
                self.totals["calls_exact"] += 1
                self.policy.observe(rec)
        except BaseException as exc:
            error = exc
        if error is not None:
            self._failure = error
        self.direct.release()
        if error is not None:
            # torch's stub types set_exception's argument as the Future's result type
            job.future.set_exception(error)  # type: ignore[arg-type]
        else:
            job.future.set_result(job.flat)

    def stats(self) -> ExchangeStats:
        inner = self.inner.stats()
        s = self._stats
        g = self.gathered
        s.bytes_sent = inner.bytes_sent + g.data_sent + g.control_bytes
        s.bytes_received = inner.bytes_received + g.data_received + g.control_bytes
        own = g.data_sent + g.control_bytes
        s.counting = inner.counting if not own else "modelled"
        payload = inner.bytes_sent + g.data_sent
        s.extra = {"compress": self.spec.get("compress"), "memory": self.spec.get("memory"),
                   "inner_exchange": self.inner.name, "inner": inner.as_dict(),
                   "allgather_bytes_sent": g.data_sent,
                   "allgather_bytes_received": g.data_received,
                   "control_bytes": g.control_bytes,
                   "dense_bytes": self.dense_bytes,
                   "dense_ring_bytes": ring_allreduce_bytes(self.dense_bytes,
                                                             max(self.ctx.world_size, 1)),
                   "traffic_ratio": (ring_allreduce_bytes(self.dense_bytes,
                                                           self.ctx.world_size) / payload
                                     if payload else None),
                   "compress_s": self.totals["compress_s"], "comm_s": self.totals["comm_s"],
                   "direct_calls": self.direct.direct_calls,
                   "iterations": self.iteration + (1 if s.calls else 0),
                   "methods": [c.describe() for c in self.policy.compressors()],
                   **self.policy.stats()}
        return super().stats()

    def close(self) -> None:
        self.direct.wait_clear(timeout=60)
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout=60)
        self.inner.close()

    # -- the exchange thread ----------------------------------------------------------------

    def _serve(self) -> None:
        while (job := self._queue.get()) is not _STOP:
            if self._failure is not None:
                self.direct.job_done()
                job.future.set_exception(ExchangeError(f"compressed exchange failed: "
                                                       f"{self._failure}"))
                continue
            try:
                self.direct.wait_clear()
                self._run(job)
            except BaseException as exc:  # the Future carries it to DDP's wait
                self._failure = exc
                self.direct.job_done()
                job.future.set_exception(exc)
                continue
            self.direct.job_done()
            job.future.set_result(job.flat)

    def _begin(self, rec: CallRecord) -> None:
        if self.records and self.records[-1].iteration != rec.iteration:
            self.records = []
            if rec.iteration == STABLE_ITERATION:  # keys are final now: forget earlier state
                self.memory.reset()
                for c in self.policy.compressors():
                    c.reset()
        self.records.append(rec)

    def _run(self, job: _Job) -> None:
        rec = job.record
        if not job.begun:
            self._begin(rec)
        trials = job.trials if job.begun else self.policy.trials(rec.name, rec.numel,
                                                                 rec.iteration)
        for trial in trials or ():
            self._trial(trial, rec, job.shapes)
        if job.chosen is None:
            rec.started = time.perf_counter()
        compressor = job.chosen or self.policy.choose(rec.name, rec.numel, rec.iteration)
        rec.method = compressor.name
        warming = rec.iteration < compressor.warmup_iterations
        use_memory = not warming and rec.iteration >= STABLE_ITERATION and not (
            compressor.lossless and not self.memory.holds(rec.name))  # nothing to add
        flat, world = job.flat, max(self.ctx.world_size, 1)
        t0 = time.perf_counter()
        p = self.memory.compensate(flat, rec.name) if use_memory else flat
        rec.memory_s = time.perf_counter() - t0
        outcome = self._drive(_plain_rounds(p), rec) if warming else \
            self._apply(compressor, p, rec, job.shapes)
        t0 = time.perf_counter()
        if use_memory and self.memory.keeps:  # (an average costs a bucket-sized tensor)
            if outcome.exact:
                self.memory.forget(rec.name)
            else:
                local = outcome.local() if (self.memory.needs_local and outcome.local) else None
                average = outcome.average if outcome.average is not None \
                    else outcome.total / world
                self.memory.update(p, rec.name, local, average)
        rec.memory_s += time.perf_counter() - t0
        if outcome.total.data_ptr() != flat.data_ptr():
            flat.copy_(outcome.total)
        rec.finished = time.perf_counter()
        self.totals["compress_s"] += rec.compute_s
        self.totals["comm_s"] += rec.comm_s
        self.totals["calls_exact"] += int(outcome.exact)
        self.policy.observe(rec)

    def _apply(self, compressor: Compressor, p: torch.Tensor, rec: CallRecord,
               shapes: list[torch.Size] | None) -> Outcome:
        """Compress ``p``, exchange the payload the method's way, decompress."""
        if compressor.summable:
            return self._drive(compressor.rounds(p, rec.name, max(self.ctx.world_size, 1),
                                                 shapes), rec)
        if compressor.sparse and self.sparse_inner:
            return self._sparse(compressor, p, rec)
        return self._gather(compressor, p, rec)

    def _trial(self, compressor: Compressor, like: CallRecord,
               shapes: list[torch.Size] | None) -> None:
        """One timed call of a fresh ``compressor`` on random data of ``like``'s size (its
        bytes are real traffic and count as such)."""
        compressor.bind(self.ctx.rank, self.ctx.world_size)
        rec = CallRecord(like.name, like.numel, like.iteration, compressor.name)
        data = torch.randn(like.numel)
        rec.started = time.perf_counter()
        self._apply(compressor, data, rec, shapes)
        rec.finished = time.perf_counter()
        self.policy.timed(rec)

    # -- summable: rounds through the inner exchange ---------------------------------------

    def _drive(self, protocol: Protocol, rec: CallRecord) -> Outcome:
        request = next(protocol)
        while True:
            results = self._perform(request, rec)
            try:
                request = protocol.send(results)
            except StopIteration as stop:
                outcome: Outcome = stop.value
                return outcome

    def _perform(self, request: Round, rec: CallRecord) -> list[torch.Tensor]:
        world = max(self.ctx.world_size, 1)
        if request.op == "max":
            values = torch.cat([t.reshape(-1).float() for t in request.tensors])
            if world > 1:
                t0 = time.perf_counter()
                dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.ctx.group)
                rec.comm_s += time.perf_counter() - t0
                self.gathered.control_bytes += ring_allreduce_bytes(values.numel() * 4, world)
            out, at = [], 0
            for t in request.tensors:
                out.append(values[at:at + t.numel()].view(t.shape))
                at += t.numel()
            return out
        if request.op != "sum":
            raise ExchangeError(f"unknown round operation {request.op!r}")
        if all(t.dtype == torch.float32 for t in request.tensors) and len(request.tensors) > 1:
            joined = torch.cat([t.reshape(-1) for t in request.tensors])
            total = self._sum(joined, rec, own=True)
            out, at = [], 0
            for t in request.tensors:
                out.append(total[at:at + t.numel()].view(t.shape))
                at += t.numel()
            return out
        return [self._sum_one(t, request, rec) for t in request.tensors]

    def _sum_one(self, t: torch.Tensor, request: Round, rec: CallRecord) -> torch.Tensor:
        world = max(self.ctx.world_size, 1)
        if t.dtype in (torch.float16, torch.bfloat16):
            if self.native:
                return self._sum(t, rec, own=False)
            return self._sum(t.to(torch.float32), rec, own=True)
        if not t.dtype.is_floating_point:
            levels = request.levels
            if levels is None:
                raise ExchangeError("an integer payload needs its levels to be summed")
            words = pack_lanes(t.reshape(-1), levels, world, self.word)
            return unpack_lane_sums(self._sum(words, rec, own=True), t.numel(), levels, world)
        return self._sum(t, rec, own=request.inplace)

    def _sum(self, t: torch.Tensor, rec: CallRecord, own: bool) -> torch.Tensor:
        """Sum ``t`` through the inner exchange (a copy unless ``own``: sums are in place)."""
        if t.numel() == 0:
            return t.clone()
        send = t if own else t.clone()
        before = self.inner.stats().bytes_sent
        t0 = time.perf_counter()
        total = self.inner.allreduce(send.reshape(-1), None).wait()
        seconds = time.perf_counter() - t0
        moved = self.inner.stats().bytes_sent - before
        rec.comm_s += seconds
        rec.wire_bytes += moved
        rec.collectives.append((moved, seconds))
        return total.view(t.shape)

    # -- non-summable: sparse exchange or all-gather ----------------------------------------

    def _sparse(self, compressor: Compressor, p: torch.Tensor, rec: CallRecord) -> Outcome:
        payload, ctx = compressor.compress(p, rec.name)
        dense = compressor.decompress(payload, ctx)
        total = self._sum(dense, rec, own=False)
        return Outcome(total, local=lambda: dense)

    def _gather(self, compressor: Compressor, p: torch.Tensor, rec: CallRecord) -> Outcome:
        world = max(self.ctx.world_size, 1)
        payload, ctx = compressor.compress(p, rec.name)
        buf = encode_payload(payload)
        sent = self.gathered.data_sent
        t0 = time.perf_counter()
        pieces = allgather_bytes(buf, self.ctx.rank, world, self.ctx.group, self.gathered,
                                 same_size=compressor.fixed_size)
        seconds = time.perf_counter() - t0
        moved = self.gathered.data_sent - sent
        rec.comm_s += seconds
        rec.wire_bytes += moved
        if world > 1 and not compressor.fixed_size:
            rec.collectives += [(8 * (world - 1), self.gathered.sizes_s),
                                (moved, seconds - self.gathered.sizes_s)]
        elif world > 1:
            rec.collectives.append((moved, seconds))
        acc = torch.zeros(p.numel(), dtype=torch.float32)
        for piece in pieces:
            compressor.decompress_add(decode_payload(piece, payload), ctx, acc)
        if compressor.aggregation == "majority":
            acc = torch.sign(acc).mul_(world)
        return Outcome(acc, local=lambda: compressor.decompress(payload, ctx))


def _plain_rounds(tensor: torch.Tensor) -> Protocol:
    """Uncompressed: one float32 sum, in place (a method's warm-up iterations)."""
    (total,) = yield Round([tensor], inplace=True)
    return Outcome(total, exact=True)
