"""Build compressed exchanges from specs: ``--compress``/``--memory`` and ``compressed:...``.

    exchange = compressed_exchange(make_exchange("ring", ctx), "topk:ratio=0.01", "residual", ctx)

``adaptive[:every=5,probe=20,margin=0.1,min_gain_ms=1,ratio=0.01,rank=4,
candidates=none+fp16+powersgd]`` chooses per bucket among the candidates (``+topk`` may be
added), with residual
memory unless another one is named; every other compressor name is a fixed method.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from dlcomm.compress.api import make_compressor, make_memory
from dlcomm.compress.base import COMPRESSORS
from dlcomm.errors import ConfigError
from dlcomm.exchange.base import Exchange, ExchangeContext, make_exchange
from dlcomm.exchange.compressed.adaptive import AdaptivePolicy
from dlcomm.exchange.compressed.exchange import CompressedExchange
from dlcomm.exchange.compressed.policy import FixedPolicy, Policy
from dlcomm.registry import Spec, parse_spec, take_option
from dlcomm.volume import ring_allreduce_bytes

__all__ = ["compressed_exchange", "compressed_from_options", "check_specs", "Agree"]

Agree = Callable[[list[float]], Callable[[], list[float]]]
CANDIDATES: tuple[str, ...] = ("none", "fp16", "powersgd", "topk")
DEFAULT_CANDIDATES: tuple[str, ...] = ("none", "fp16", "powersgd")


def _adaptive(options: dict[str, str], ctx: ExchangeContext, agree: Agree) -> Policy:
    owner = "compressor 'adaptive'"
    every = take_option(options, "every", int, 5, owner, lambda v: v >= 1, "every >= 1")
    probe = take_option(options, "probe", int, 20, owner, lambda v: v >= 0,
                        "probe >= 0 (0: never)")
    margin = take_option(options, "margin", float, 0.1, owner, lambda v: 0 <= v < 1,
                         "0 <= margin < 1")
    min_gain = take_option(options, "min_gain_ms", float, 1.0, owner, lambda v: v >= 0, ">= 0")
    ratio = take_option(options, "ratio", float, 0.01, owner, lambda v: 0 < v <= 1,
                        "0 < ratio <= 1")
    rank = take_option(options, "rank", int, 4, owner, lambda v: v >= 1, "rank >= 1")
    names = take_option(options, "candidates", lambda t: tuple(t.split("+")),
                        DEFAULT_CANDIDATES, owner,
                        lambda v: set(v) <= set(CANDIDATES),
                        "a +-separated subset of none+fp16+powersgd+topk")
    if options:
        raise ConfigError(f"{owner} has no option(s) {sorted(options)}")
    return AdaptivePolicy(max(ctx.world_size, 1), agree, every, probe, margin, min_gain, ratio,
                          rank, names)


def _agreement(ctx: ExchangeContext, count: Callable[[int], None]) -> Agree:
    """Averaging a few floats over the workers, started now and collected later (the
    adaptive policy's decisions); ``count(bytes)`` is told what each one moves."""

    def agree(values: list[float]) -> Callable[[], list[float]]:
        t = torch.tensor(values, dtype=torch.float64)
        if ctx.world_size <= 1:
            return t.tolist
        work = dist.all_reduce(t, group=ctx.group, async_op=True)
        count(ring_allreduce_bytes(t.numel() * 8, ctx.world_size))

        def collect() -> list[float]:
            assert work is not None
            work.wait()
            return (t / ctx.world_size).tolist()
        return collect
    return agree


def compressed_exchange(inner: Exchange, compress_spec: str, memory_spec: str,
                        ctx: ExchangeContext) -> CompressedExchange:
    """Wrap ``inner`` with the compressor ``compress_spec`` and the memory ``memory_spec``.

    The result is an :class:`~dlcomm.exchange.base.Exchange` with sum semantics.
    """
    compress = parse_spec(compress_spec)
    memory_parsed = parse_spec(memory_spec)
    holder: list[CompressedExchange] = []

    def count(nbytes: int) -> None:
        holder[0].gathered.control_bytes += nbytes

    policy: Policy
    if compress.name == "adaptive":
        policy = _adaptive(dict(compress.options), ctx, _agreement(ctx, count))
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
    """The ``compressed:method=...,memory=...,over=...`` exchange spec."""
    method = options.pop("method", None)
    if not method:
        raise ConfigError("exchange 'compressed' needs method=NAME (e.g. method=topk,ratio=0.01)")
    memory = options.pop("memory", "none")
    over = options.pop("over", "ring")
    if over == "compressed":
        raise ConfigError("exchange 'compressed' cannot wrap itself")
    # the switch's address, fingerprints, token, protection and injected loss (given by the
    # launcher) belong to the inner one
    inner_options: dict[str, str] = {key: options.pop(key) for key in (
        "addr", "fp", "token_file", "auth", "drop") if key in options}
    if inner_options:
        over = str(Spec(over, {**inner_options, **parse_spec(over).options}))
    named = parse_spec(method)  # method=powersgd:rank=4 and method=powersgd,rank=4 alike
    spec = str(Spec(named.name, {**named.options, **options}))
    if named.name != "adaptive":
        COMPRESSORS.check(named.name)
    inner = make_exchange(over, ctx)
    try:
        return compressed_exchange(inner, spec, memory, ctx)
    except BaseException:
        inner.close()
        raise
