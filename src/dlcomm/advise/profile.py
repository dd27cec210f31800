"""What a job's iteration looks like to the network: compute, buckets, density.

A :class:`JobProfile` holds one worker's iteration: forward, backward and optimizer
seconds, the DDP gradient buckets (bytes, and when backward has filled each), and the
gradients' block density (what sparse aggregation can skip). It comes from

- the catalog (:func:`catalog_profile`): layer FLOPs over the accelerator's sustained
  FLOP/s (``workloads/catalog/compute.py``), DDP's bucket caps;
- a few real steps on this machine (:func:`measure_profile`): a trainable workload or the
  user's own model; each parameter's gradient is timed as it is accumulated, and the
  buckets are formed from those times as DDP forms them (25 MiB, a first bucket of 1 MiB,
  backward order). Compute is scaled to a named accelerator by the ratio of this CPU's
  sustained FLOP/s (a float32 matrix product, measured) to the accelerator's.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from dlcomm.errors import ConfigError
from dlcomm.workloads.accelerators import get_accelerator
from dlcomm.workloads.catalog import get_model
from dlcomm.workloads.catalog.compute import (
    DDP_BUCKET_CAP_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    Bucket,
    gradient_buckets,
    iteration_time,
    model_buckets,
)

__all__ = ["JobProfile", "catalog_profile", "measure_profile", "load_user_model",
           "cpu_flops", "scaled", "fitted_to_step", "DENSITY_BLOCK"]

DENSITY_BLOCK = 256  # the sparse exchange's default block


@dataclass(frozen=True)
class JobProfile:
    """One worker's iteration, as the cost model needs it."""

    name: str
    forward_s: float
    backward_s: float
    optimizer_s: float
    buckets: tuple[Bucket, ...]
    density: float = 1.0          # fraction of 256-element gradient blocks holding data
    batch: int = 0                # samples per worker
    source: str = "catalog"       # catalog | measured
    accelerator: str = "cpu"
    shapes: tuple[tuple[int, ...], ...] = ()  # gradient tensors (measured models)
    overhead_s: float = 0.0       # the trainer's own cost per step (data, DDP, records)
    emulated_s: float = 0.0       # compute per step not on this CPU (--compute-ms), slept
    union_density: float | None = None  # blocks holding data in any worker's gradient

    @property
    def result_density(self) -> float:
        """The share of blocks a sparse all-reduce's result carries: the union of the
        workers' blocks (each worker's batch touches its own; ``density`` where unknown)."""
        return self.density if self.union_density is None else self.union_density

    @property
    def compute_s(self) -> float:
        """This CPU's compute per step (the emulated compute not included)."""
        return self.forward_s + self.backward_s + self.optimizer_s + self.overhead_s

    @property
    def gradient_bytes(self) -> int:
        return sum(b.bytes for b in self.buckets)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "accelerator": self.accelerator,
                "batch": self.batch, "forward_s": self.forward_s,
                "backward_s": self.backward_s, "optimizer_s": self.optimizer_s,
                "overhead_s": self.overhead_s, "emulated_s": self.emulated_s,
                "density": self.density, "union_density": self.result_density,
                "gradient_bytes": self.gradient_bytes,
                "buckets": [{"bytes": b.bytes, "ready_s": b.ready_s} for b in self.buckets]}


def scaled(profile: JobProfile, factor: float, accelerator: str) -> JobProfile:
    """``profile`` with compute ``factor`` times as long (buckets' ready times too)."""
    buckets = tuple(replace(b, ready_s=b.ready_s * factor) for b in profile.buckets)
    return replace(profile, forward_s=profile.forward_s * factor,
                   backward_s=profile.backward_s * factor,
                   optimizer_s=profile.optimizer_s * factor,
                   overhead_s=profile.overhead_s * factor, buckets=buckets,
                   accelerator=accelerator)


def fitted_to_step(profile: JobProfile, step_s: float) -> JobProfile:
    """``profile`` made to add up to a step the trainer measured (``step_s``, one worker,
    the same threads): what the trainer spends beyond the profile's compute is its own
    overhead (data, DDP, records), taken after the last bucket; a trainer step shorter
    than the profile's compute (its per-gradient hooks slow the profiled backward, or the
    machine was slower while it ran) scales the profile's phases down to it, instead of
    keeping the longer compute and no overhead."""
    compute = profile.forward_s + profile.backward_s + profile.optimizer_s
    if step_s >= compute or compute <= 0:
        return replace(profile, overhead_s=max(0.0, step_s - compute))
    return replace(scaled(profile, step_s / compute, profile.accelerator), overhead_s=0.0)


def catalog_profile(model_name: str, accelerator: str, batch: int) -> JobProfile:
    """A catalog model's iteration on ``accelerator`` at ``batch`` samples per worker."""
    model = get_model(model_name)
    acc = get_accelerator(accelerator)
    timing = iteration_time(model, acc, batch)
    buckets = model_buckets(model, timing, DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES)
    return JobProfile(model_name, timing.forward_s, timing.backward_s, 0.0, buckets, 1.0,
                      batch, "catalog", accelerator)


def cpu_flops(n: int = 1024, repeats: int = 5) -> float:
    """This machine's sustained float32 FLOP/s (a matrix product, the median of repeats)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def load_user_model(target: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``package.module:function`` -> (model, sample batch); one-line errors."""
    module_name, sep, func_name = target.partition(":")
    if not sep or not module_name or not func_name:
        raise ConfigError(f"--model must be package.module:function, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 (whatever the user's import raises)
        raise ConfigError(f"--model {target}: cannot import {module_name}: "
                          f"{type(exc).__name__}: {exc}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ConfigError(f"--model {target}: {module_name} has no function {func_name}")
    try:
        made = func()
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"--model {target}: {func_name}() raised "
                          f"{type(exc).__name__}: {exc}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise ConfigError(f"--model {target}: {func_name}() must return (nn.Module, sample "
                          f"batch), got {type(made).__name__}")
    model, sample = made
    batch = sample if isinstance(sample, tuple) else (sample,)
    if not batch or not all(isinstance(t, torch.Tensor) for t in batch):
        raise ConfigError(f"--model {target}: the sample batch must be a tensor or a tuple "
                          "of tensors")
    return model, batch


def _square_loss(out: Any) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise ConfigError("the model's output must be a tensor to train on (the user "
                          "model's loss is the mean square of its output)")
    return out.float().square().mean()


def measure_profile(name: str, model: nn.Module, batch: tuple[torch.Tensor, ...],
                    loss: Callable[[Any], torch.Tensor] | None = None, steps: int = 6,
                    warmup: int = 2,
                    workers_losses: Sequence[Callable[[], torch.Tensor]] = ()) -> JobProfile:
    """Time ``steps`` real iterations of ``model`` on ``batch`` here (median after
    ``warmup``): forward, backward with each gradient's ready time, an SGD step; and the
    gradients' block density, and (``workers_losses``: each worker's own batch's loss)
    the density of the union of the workers' blocks, which a sparse result carries."""
    loss = loss or _square_loss
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError(f"{name}: the model has no trainable parameters")
    opt = torch.optim.SGD(params, lr=1e-3)
    ready: dict[int, float] = {}
    clock = [0.0]
    handles = [p.register_post_accumulate_grad_hook(
        lambda p, i=i: ready.__setitem__(i, time.perf_counter() - clock[0]))
        for i, p in enumerate(params)]
    runs = []
    try:
        for _ in range(warmup + steps):
            ready.clear()
            opt.zero_grad()
            t0 = time.perf_counter()
            value = loss(model(*batch))
            t1 = clock[0] = time.perf_counter()
            value.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            runs.append((t1 - t0, t2 - t1, t3 - t2, dict(ready)))
    finally:
        for h in handles:
            h.remove()
    kept = runs[warmup:]
    fwd, bwd, opt_s = (statistics.median(r[k] for r in kept) for k in range(3))
    times = {i: statistics.median(r[3].get(i, bwd) for r in kept) for i in range(len(params))}
    order = sorted(times, key=lambda i: times[i])
    deltas, last = [], 0.0
    for i in order:
        deltas.append(max(times[i] - last, 0.0))
        last = max(times[i], last)
    buckets = gradient_buckets([f"p{i}" for i in order], [params[i].numel() for i in order],
                               deltas, DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES)
    present = _blocks_present(params)
    density = float(present.float().mean())
    union = None
    if workers_losses:
        for worker_loss in workers_losses:
            opt.zero_grad()
            worker_loss().backward()
            present = present | _blocks_present(params)
        union = float(present.float().mean())
    samples = int(batch[0].shape[0]) if batch[0].dim() else 1
    shapes = tuple(tuple(p.shape) for p in params)
    return JobProfile(name, fwd, bwd, opt_s, buckets, density, samples, "measured", "cpu",
                      shapes, union_density=union)


def _blocks_present(params: list[nn.Parameter]) -> torch.Tensor:
    """Which 256-element blocks of the flattened gradients hold a non-zero value."""
    flat = torch.cat([p.grad.detach().reshape(-1) if p.grad is not None
                      else torch.zeros(p.numel()) for p in params])
    pad = (-flat.numel()) % DENSITY_BLOCK
    blocks = torch.nn.functional.pad(flat, (0, pad)).view(-1, DENSITY_BLOCK)
    return (blocks != 0).any(dim=1)
