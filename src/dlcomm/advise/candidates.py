"""The candidates the advisor weighs, with their compressors measured on this CPU."""

from __future__ import annotations

import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import Any

import torch

from dlcomm.advise.cost import Candidate
from dlcomm.compress import make_compressor
from dlcomm.compress.api import wire_bytes
from dlcomm.errors import DlcommError
from dlcomm.runtime.processes import die_with

__all__ = ["EXCHANGES", "METHODS", "measure_method", "sample_sizes", "measure_together",
           "processes_for", "memory_budget", "candidates"]

EXCHANGES = ("ring", "switch", "sparse-switch", "auto")
METHODS = ("fp16", "powersgd:rank=4", "topk:ratio=0.01")
SAMPLE = 2**20  # elements a compressor is measured on, at least
BYTES_TIMED = 32  # a process timing a compressor holds about this per element, at most
PROCESS_BYTES = 400 * 2**20  # and this much besides (torch, once imported)
MAX_SIZES = 6  # bucket sizes a compressor is timed at, at most
MIN_TIMED_S = 0.5  # a compressor is timed for ``repeats`` runs and this long, at least
MAX_PEERS_TIMED = 16  # peers' payloads decompressed while timing; more are extrapolated
MAX_TOGETHER = 16  # processes timed at once for workers sharing the cores; more share as these
BARRIER_S = 300.0  # a process that waits longer for the others gives up (one failed)


def _summable_wire(compressor: Any, flat: torch.Tensor, shapes: list[torch.Size]
                   ) -> tuple[dict[str, int], int, torch.Tensor]:
    """(bytes per inner exchange, rounds, the sum) one worker puts into the inner exchange
    for ``flat``: the rounds of the compressor's collective, as the compressed exchange runs
    them (world of one); the ring carries each tensor as is, the switch widens what is not
    float32 to 32 bits."""
    protocol = compressor.rounds(flat, "bucket", 1, shapes or None)
    wire, rounds, request = {"ring": 0, "switch": 0}, 0, next(protocol)
    while True:
        rounds += 1
        for t in request.tensors:
            wire["ring"] += t.numel() * t.element_size()
            wire["switch"] += t.numel() * (t.element_size() if t.dtype == torch.float32
                                           else 4)
        try:
            request = protocol.send([t.clone() for t in request.tensors])
        except StopIteration as done:
            return wire, rounds, done.value.total


def measure_method(spec: str, workers: int, shapes: tuple[tuple[int, ...], ...] = (),
                   repeats: int = 3, sample: int = SAMPLE,
                   clock: Callable[[], float] = time.perf_counter) -> list[Candidate]:
    """Compress the job's gradients (one bucket of ``shapes``, as the DDP hook hands them
    over, so that PowerSGD works matrix by matrix), or one flat bucket of ``sample``
    elements when the shapes are unknown (catalog models: the emulation hands over flat
    buckets), on normal values, as the compressed exchange does (from the bucket to its
    sum written back; the bucket's copy is not timed): the rate on this CPU (top-k's falls
    as the bucket grows: it is measured at the job's size), the median of ``repeats`` runs
    or more, for
    MIN_TIMED_S at least (a shared machine's rate wanders), timed by ``clock``: wall time,
    or the process's CPU time when it shares the cores with others (a rate per core).
    One candidate per exchange the method can use, with the wire ratio as that exchange
    carries it: a summable method over the ring and the switch (the same compression), an
    other over the ring (an all-gather through gloo)."""
    compressor = make_compressor(spec)
    sizes = [torch.Size(s) for s in shapes] or [torch.Size((sample,))]
    elements = sum(s.numel() for s in sizes)
    flat = torch.randn(elements, generator=torch.Generator().manual_seed(0))
    times: list[float] = []
    wire: dict[str, int] = {}
    rounds = 2  # an all-gather: the sizes, then the payloads
    start = clock()
    while len(times) < repeats or clock() - start < MIN_TIMED_S:
        bucket = flat.clone()  # the bucket the exchange is handed (not timed)
        t0, untimed = clock(), 0.0
        if compressor.summable:
            wire, rounds, total = _summable_wire(compressor, bucket, sizes if shapes else [])
        else:  # the all-gather path: compress once, decompress and add every peer's payload
            payload, ctx = compressor.compress(bucket, "bucket")
            t1 = clock()
            total = torch.zeros_like(flat)
            peers = min(workers, MAX_PEERS_TIMED)
            for _ in range(peers):
                total += compressor.decompress(payload, ctx)
            # the other peers' payloads cost as much each
            untimed = (clock() - t1) * (workers - peers) / peers
            wire = {"ring": wire_bytes(compressor, payload, workers, True)}
        bucket.copy_(total)  # the exchange writes the sum into the bucket
        times.append(clock() - t0 + untimed)
    rate = 32 * elements / statistics.median(times)
    return [Candidate(over, spec, nbytes / (4 * elements), compressor.summable, rate,
                      rounds=rounds) for over, nbytes in wire.items()]


def sample_sizes(bucket_elements: Sequence[int], largest: int) -> tuple[int, ...]:
    """The sizes a compressor is timed at, for buckets of ``bucket_elements``: each bucket's,
    within [SAMPLE, largest], the smallest of those within a quarter of each other, at
    most MAX_SIZES of them (spread evenly from the smallest to the largest)."""
    largest = max(SAMPLE, largest)
    clipped = sorted({min(largest, max(SAMPLE, int(n))) for n in bucket_elements}) or \
        [SAMPLE]
    sizes = [clipped[0]]
    for n in clipped[1:]:
        if n > sizes[-1] * 1.25:
            sizes.append(n)
    if len(sizes) > MAX_SIZES:
        step = (len(sizes) - 1) / (MAX_SIZES - 1)
        sizes = [sizes[round(i * step)] for i in range(MAX_SIZES)]
    return tuple(sizes)


def memory_budget() -> int:
    """Bytes the timing may hold: half of the memory available now."""
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kib * 1024 // 2
    except (OSError, StopIteration, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


def processes_for(elements: int, together: int, budget: int) -> int:
    """Processes that time a compressor on ``elements`` at once: ``together``, or as many
    as ``budget`` bytes hold (one at least). A bucket too large for all the workers' share
    of the cores is timed in fewer processes, each by its CPU time: beyond the caches a
    compressor's rate per core is set by the memory bandwidth the processes on the other
    cores take, not by how many take turns on one."""
    return max(1, min(together, budget // (BYTES_TIMED * max(1, elements) + PROCESS_BYTES)))


_barrier: Any = None  # in a process measuring together: the others' meeting point


def _join(barrier: Any, threads: int, parent: int) -> None:
    """A process that measures together with others: dies with the advisor, runs with a
    worker's threads, meets the others before each measurement."""
    die_with(parent)
    global _barrier
    _barrier = barrier
    torch.set_num_threads(threads)


def _measure_jobs(jobs: Sequence[tuple[str, int]], workers: int,
                  shapes: tuple[tuple[int, ...], ...], clock: Callable[[], float]
                  ) -> list[list[Candidate]]:
    """Each (method, sample) measured in turn; together with the other processes if this
    is one of them (every one starts each measurement when all are ready)."""
    out = []
    try:
        for spec, sample in jobs:
            if _barrier is not None:
                _barrier.wait()
            out.append(measure_method(spec, workers, shapes, sample=sample, clock=clock))
    except BaseException:
        if _barrier is not None:
            _barrier.abort()  # the others stop waiting for this one
        raise
    return out


def measure_together(procs: int, jobs: Sequence[tuple[str, int]], workers: int,
                     shapes: tuple[tuple[int, ...], ...] = (),
                     clock: Callable[[], float] = time.perf_counter
                     ) -> list[list[Candidate]]:
    """Each (method, sample) measured as ``workers`` that share this machine's cores run
    it: in ``procs`` processes at once (at most MAX_TOGETHER), each with this process's
    torch threads, timed by CPU time: the rate per core when the cores' caches and memory
    are shared (a compressor's can fall by half), the median of the processes'. One
    process measures here, by ``clock`` (wall time, or its CPU time where it stands for
    workers that share the cores)."""
    if procs <= 1:
        return _measure_jobs(jobs, workers, shapes, clock)
    procs = min(procs, MAX_TOGETHER)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(procs, timeout=BARRIER_S)
    try:
        with ProcessPoolExecutor(procs, mp_context=ctx, initializer=_join, initargs=(
                barrier, torch.get_num_threads(), os.getpid())) as pool:
            futures = [pool.submit(_measure_jobs, jobs, workers, shapes, time.process_time)
                       for _ in range(procs)]
            runs = [f.result() for f in futures]
    except BrokenProcessPool as e:
        raise DlcommError(f"measuring the compressors in {procs} processes at once: one "
                          "died (out of memory?)") from e
    rates = [statistics.median(run[i][0].compress_bps for run in runs)
             for i in range(len(jobs))]  # a job's candidates share their timing
    return [[replace(c, compress_bps=rate) for c in first]
            for first, rate in zip(runs[0], rates)]


def _measure_fitting(jobs: list[tuple[str, int]], together: int, workers: int,
                     shapes: tuple[tuple[int, ...], ...], budget: int
                     ) -> list[list[Candidate]]:
    """:func:`measure_together` for each job, in as many processes as fit ``budget``
    (:func:`processes_for`), in the order of ``jobs``."""
    shaped = sum(math.prod(s) for s in shapes)
    procs = [processes_for(shaped or n, together, budget) for _, n in jobs]
    clock = time.process_time if together > 1 else time.perf_counter  # per core, or wall
    done: dict[tuple[str, int], list[Candidate]] = {}
    for p in sorted(set(procs), reverse=True):
        mine = [job for job, q in zip(jobs, procs) if q == p]
        done.update(zip(mine, measure_together(p, mine, workers, shapes, clock)))
    return [done[job] for job in jobs]


def _over_sizes(each: list[Candidate], sizes: tuple[int, ...]) -> Candidate:
    """One candidate from its timings at ``sizes`` (the largest's figures are its own)."""
    return replace(each[-1], sizes=tuple((n, c.ratio, c.compress_bps)
                                         for n, c in zip(sizes, each))
                   if len(sizes) > 1 else ())


def candidates(workers: int, methods: tuple[str, ...] = METHODS,
               shapes: tuple[tuple[int, ...], ...] = (),
               bucket_elements: Sequence[int] = (SAMPLE,), together: int = 1
               ) -> list[Candidate]:
    """Every exchange, and every method over the exchanges it can use (not the switch
    where it saves nothing: the switch widens float16 to 32 bits); without shapes, timed
    on flat buckets of the job's sizes (``sample_sizes``): a bucket is priced at the rate
    and ratio measured nearest its size. ``together``: the workers that share this
    machine's cores when the cluster runs here (:func:`measure_together`)."""
    budget = memory_budget()
    sizes = (SAMPLE,) if shapes else sample_sizes(bucket_elements, budget // BYTES_TIMED)
    measured = iter(_measure_fitting([(spec, n) for spec in methods for n in sizes],
                                     together, workers, shapes, budget))
    out = [Candidate(e) for e in EXCHANGES]
    for _spec in methods:
        each = [next(measured) for _ in sizes]  # per size, a candidate per exchange
        for over in zip(*each):
            cand = _over_sizes(list(over), sizes)
            if cand.exchange == "ring" or cand.ratio < 1:
                out.append(cand)
    return out
