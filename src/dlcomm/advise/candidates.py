"""The candidates the advisor weighs, with their compressors measured on this CPU."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from dlcomm.advise.cost import Candidate
from dlcomm.compress import make_compressor
from dlcomm.compress.api import wire_bytes

__all__ = ["EXCHANGES", "METHODS", "measure_method", "candidates"]

EXCHANGES = ("ring", "switch", "sparse-switch", "auto")
METHODS = ("fp16", "powersgd:rank=4", "topk:ratio=0.01")
SAMPLE = 2**20  # elements a compressor is measured on, at least
MAX_SAMPLE = 8 * 2**20
MAX_PEERS_TIMED = 16  # peers' payloads decompressed while timing; more are extrapolated


def _summable_wire(compressor: Any, flat: torch.Tensor, shapes: list[torch.Size],
                   native: bool) -> tuple[int, int]:
    """(bytes, rounds) one worker puts into the inner exchange for ``flat``: the rounds of
    the compressor's collective, as the compressed exchange runs them (world of one)."""
    protocol = compressor.rounds(flat, "bucket", 1, shapes or None)
    wire, rounds, request = 0, 0, next(protocol)
    while True:
        rounds += 1
        wire += sum(t.numel() * (t.element_size() if native or t.dtype == torch.float32
                                 else 4) for t in request.tensors)
        try:
            request = protocol.send([t.clone() for t in request.tensors])
        except StopIteration:
            return wire, rounds


def measure_method(spec: str, workers: int, over: str,
                   shapes: tuple[tuple[int, ...], ...] = (), repeats: int = 3,
                   sample: int = SAMPLE) -> Candidate:
    """Compress the job's gradients (one bucket of ``shapes``, as the DDP hook hands them
    over, so that PowerSGD works matrix by matrix), or one flat bucket of ``sample``
    elements when the shapes are unknown (catalog models: the emulation hands over flat
    buckets), on normal values: the wire ratio (as the inner exchange carries it: the
    switch widens float16 to 32 bits) and the rate on this CPU (top-k's falls as the bucket
    grows: it is measured at the job's size)."""
    compressor = make_compressor(spec)
    sizes = [torch.Size(s) for s in shapes] or [torch.Size((sample,))]
    elements = sum(s.numel() for s in sizes)
    flat = torch.randn(elements, generator=torch.Generator().manual_seed(0))
    native = over == "ring"
    times, wire, rounds = [], 0, 2  # an all-gather: the sizes, then the payloads
    for _ in range(repeats):
        t0, untimed = time.perf_counter(), 0.0
        if compressor.summable:
            wire, rounds = _summable_wire(compressor, flat.clone(), sizes if shapes else [],
                                          native)
        else:  # the all-gather path: compress once, decompress and add every peer's payload
            payload, ctx = compressor.compress(flat.clone(), "bucket")
            t1 = time.perf_counter()
            total = torch.zeros_like(flat)
            peers = min(workers, MAX_PEERS_TIMED)
            for _ in range(peers):
                total += compressor.decompress(payload, ctx)
            # the other peers' payloads cost as much each
            untimed = (time.perf_counter() - t1) * (workers - peers) / peers
            wire = wire_bytes(compressor, payload, workers, native)
        times.append(time.perf_counter() - t0 + untimed)
    inner = over if compressor.summable else "ring"  # an all-gather goes through gloo
    return Candidate(inner, spec, wire / (4 * elements), compressor.summable,
                     32 * elements / statistics.median(times), rounds=rounds)


def candidates(workers: int, methods: tuple[str, ...] = METHODS,
               shapes: tuple[tuple[int, ...], ...] = (), bucket_elements: int = SAMPLE
               ) -> list[Candidate]:
    """Every exchange, and every method over the exchanges it can use; without shapes,
    measured on a bucket of ``bucket_elements`` (the job's largest; within bounds)."""
    out = [Candidate(e) for e in EXCHANGES]
    sample = min(MAX_SAMPLE, max(SAMPLE, bucket_elements))
    for spec in methods:
        for over in ("ring", "switch"):
            cand = measure_method(spec, workers, over, shapes, sample=sample)
            if cand.exchange != over or (over == "switch" and cand.ratio >= 1):
                continue  # all-gathered (listed once, over ring), or nothing saved
            out.append(cand)
    return out
