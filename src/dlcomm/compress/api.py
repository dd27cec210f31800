"""The public face of dlcomm.compress: build compressors, memories and compressed exchanges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dlcomm.compress import (bf16, dgc, efsignsgd, fp16, natural, none, onebit,  # noqa: F401
                             powersgd, qsgd, randomk, signsgd, signum, terngrad, threshold,
                             topk, u8bit)
from dlcomm.compress import memory as _memory  # noqa: F401  (registers the memories)
from dlcomm.compress.adaptive import AdaptivePolicy
from dlcomm.compress.allgather import encode_payload
from dlcomm.compress.base import COMPRESSORS, MEMORIES, Compressor, Memory, Payload, option
from dlcomm.compress.exchange import CompressedExchange, FixedPolicy, Policy
from dlcomm.compress.packing import lanes_per_word
from dlcomm.errors import ConfigError
from dlcomm.exchange.base import Exchange, ExchangeContext, make_exchange
from dlcomm.exchange.ring import ring_bytes_per_worker
from dlcomm.registry import Spec, parse_spec

__all__ = ["COMPRESSORS", "MEMORIES", "Compressor", "Memory", "CompressedExchange",
           "compressed_exchange", "compressed_from_options", "make_compressor", "make_memory",
           "run_local", "wire_bytes", "check_specs"]


def make_compressor(spec: str | Spec) -> Compressor:
    """Build the compressor named by ``spec`` (``topk:ratio=0.01``, ``powersgd:rank=4``)."""
    parsed = spec if isinstance(spec, Spec) else parse_spec(spec)
    if parsed.name == "adaptive":
        raise ConfigError("'adaptive' chooses compressors per bucket inside an exchange; "
                          "use compressed_exchange(..., 'adaptive', ...)")
    return COMPRESSORS.get(parsed.name)(**dict(parsed.options))


def make_memory(spec: str | Spec) -> Memory:
    """Build the error-feedback memory named by ``spec`` (``residual``, ``dgc:momentum=0.9``)."""
    parsed = spec if isinstance(spec, Spec) else parse_spec(spec)
    return MEMORIES.get(parsed.name)(**dict(parsed.options))


def _adaptive(options: dict[str, str], ctx: ExchangeContext, agree: Any) -> Policy:
    owner = "compressor 'adaptive'"
    every = option(options, "every", int, 5, owner, lambda v: v >= 1, "every >= 1")
    probe = option(options, "probe", int, 20, owner, lambda v: v >= 0, "probe >= 0 (0: never)")
    margin = option(options, "margin", float, 0.1, owner, lambda v: 0 <= v < 1, "0 <= margin < 1")
    min_gain = option(options, "min_gain_ms", float, 1.0, owner, lambda v: v >= 0, ">= 0")
    ratio = option(options, "ratio", float, 0.01, owner, lambda v: 0 < v <= 1, "0 < ratio <= 1")
    rank = option(options, "rank", int, 4, owner, lambda v: v >= 1, "rank >= 1")
    names = option(options, "candidates", lambda t: tuple(t.split("+")),
                   ("none", "fp16", "powersgd", "topk"), owner,
                   lambda v: set(v) <= {"none", "fp16", "powersgd", "topk"},
                   "a +-separated subset of none+fp16+powersgd+topk")
    if options:
        raise ConfigError(f"{owner} has no option(s) {sorted(options)}")
    return AdaptivePolicy(max(ctx.world_size, 1), agree, every, probe, margin, min_gain, ratio,
                          rank, names)


def compressed_exchange(inner: Exchange, compress_spec: str, memory_spec: str,
                        ctx: ExchangeContext) -> CompressedExchange:
    """Wrap ``inner`` with the compressor ``compress_spec`` and the memory ``memory_spec``.

    The result is an :class:`~dlcomm.exchange.base.Exchange` with sum semantics.
    ``adaptive[:every=5,probe=20,margin=0.1,min_gain_ms=1,ratio=0.01,rank=4,
    candidates=none+fp16+powersgd+topk]`` chooses per bucket among the candidates, with
    residual memory unless another one is named.
    """
    compress = parse_spec(compress_spec)
    memory_parsed = parse_spec(memory_spec)
    holder: list[CompressedExchange] = []

    def agree(values: list[float]) -> Callable[[], list[float]]:
        """Start averaging ``values`` over the workers; the call returned waits for it."""
        t = torch.tensor(values, dtype=torch.float64)
        if ctx.world_size <= 1:
            return t.tolist
        work = dist.all_reduce(t, group=ctx.group, async_op=True)
        holder[0].gathered.control_bytes += ring_bytes_per_worker(t.numel() * 8,
                                                                  ctx.world_size)

        def collect() -> list[float]:
            work.wait()
            return (t / ctx.world_size).tolist()
        return collect

    if compress.name == "adaptive":
        policy = _adaptive(dict(compress.options), ctx, agree)
        if memory_parsed.name == "none":
            memory_parsed = Spec("residual")
    else:
        policy = FixedPolicy(make_compressor(compress))
    memory = make_memory(memory_parsed)
    exchange = CompressedExchange(inner, policy, memory, ctx,
                                  {"compress": str(compress), "memory": str(memory_parsed)})
    holder.append(exchange)
    return exchange


def check_specs(compress_spec: str, memory_spec: str) -> None:
    """Raise a one-line ConfigError for a bad ``--compress``/``--memory`` before any worker
    starts (the adaptive policy's options included)."""
    compress = parse_spec(compress_spec)
    if compress.name == "adaptive":
        _adaptive(dict(compress.options), ExchangeContext(0, 2), lambda v: lambda: v)
    else:
        make_compressor(compress)
    make_memory(memory_spec)


def compressed_from_options(ctx: ExchangeContext, options: dict[str, str]) -> Exchange:
    """The ``compressed:method=...,memory=...,over=...`` exchange spec (registration.py)."""
    method = options.pop("method", None)
    if not method:
        raise ConfigError("exchange 'compressed' needs method=NAME (e.g. method=topk,ratio=0.01)")
    memory = options.pop("memory", "none")
    over = options.pop("over", "ring")
    if over == "compressed":
        raise ConfigError("exchange 'compressed' cannot wrap itself")
    # the switch's address and injected loss (given by the launcher) belong to the inner one
    inner_options = {key: options.pop(key) for key in ("addr", "drop") if key in options}
    if inner_options:
        over = str(Spec(over, {**inner_options, **parse_spec(over).options}))
    spec = str(Spec(method, options))
    if method != "adaptive":
        COMPRESSORS.check(method)
    inner = make_exchange(over, ctx)
    try:
        return compressed_exchange(inner, spec, memory, ctx)
    except BaseException:
        inner.close()
        raise


def wire_bytes(compressor: Compressor, payload: Payload, world: int, native: bool) -> int:
    """Bytes one worker puts into its collective for ``payload`` (before the collective's
    own factor: 2(n-1)/n for a ring all-reduce, n-1 for an all-gather)."""
    if not compressor.summable:
        return encode_payload(payload).numel()
    levels = compressor.payload_levels()
    total = 0
    for t in payload:
        if t.dtype.is_floating_point:
            wide = t.dtype == torch.float32 or not native
            total += t.numel() * (4 if wide else 2)
        elif levels is not None:
            lanes = lanes_per_word(levels, world, torch.int32 if native else torch.float32)
            total += -(-t.numel() // lanes) * 4
    return total


def run_local(compressor: Compressor, tensor: torch.Tensor, name: str = "t"
              ) -> tuple[torch.Tensor, Payload]:
    """Compress and decompress on one worker (GRACE's interface): (approximation, payload)."""
    payload, ctx = compressor.compress(tensor, name)
    return compressor.decompress(payload, ctx), payload
