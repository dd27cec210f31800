"""Compute time of one training iteration, and DDP-style gradient buckets with ready times.

The emulator waits these times instead of computing, and the simulator schedules them;
both take the same numbers from here.

Time model (per accelerator, per iteration of ``batch`` samples):

1. forward time of layer l = ``flops_l * batch / (peak_flops * efficiency)``;
2. backward time of layer l = ``BACKWARD_FACTOR`` (2) x its forward time: backward computes
   the gradient with respect to the input and to the weights, each a product of the
   forward's size, hence training ~ 3x forward FLOPs (Kaplan et al. 2020, Sec. 2.1;
   Narayanan et al., SC 2021). Parameter-free layers (pooling, attention) are given the
   same factor; the first layer's unneeded input gradient is not subtracted;
3. ``efficiency`` is the achieved fraction of peak (the accelerator's default, 0.4, unless
   overridden); a measured iteration time replaces the estimate by scaling every layer's
   forward and backward time by ``measured / estimated``, keeping the per-layer shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dlcomm.errors import ConfigError
from dlcomm.workloads.accelerators import Accelerator
from dlcomm.workloads.catalog.base import ModelTable

__all__ = ["BACKWARD_FACTOR", "DDP_BUCKET_CAP_BYTES", "DDP_FIRST_BUCKET_BYTES",
           "IterationTime", "Bucket", "iteration_time", "gradient_buckets", "model_buckets"]

BACKWARD_FACTOR = 2.0
DDP_BUCKET_CAP_BYTES = 25 * 2**20   # DistributedDataParallel(bucket_cap_mb=25), MiB
DDP_FIRST_BUCKET_BYTES = 2**20      # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class IterationTime:
    """Per-layer compute times of one iteration on one accelerator (seconds)."""

    model: str
    accelerator: str
    batch: int                                    # samples per accelerator
    efficiency: float                             # fraction of peak assumed
    forward: tuple[tuple[str, float], ...]        # (layer, s) in forward order
    backward: tuple[tuple[str, float], ...]       # (layer, s) in backward order
    scale: float = 1.0                            # measured / estimated; 1 if estimated

    @property
    def forward_s(self) -> float:
        return sum(t for _, t in self.forward)

    @property
    def backward_s(self) -> float:
        return sum(t for _, t in self.backward)

    @property
    def iteration_s(self) -> float:
        return self.forward_s + self.backward_s


def iteration_time(model: ModelTable, accelerator: Accelerator, batch: int,
                   efficiency: float | None = None,
                   measured_s: float | None = None) -> IterationTime:
    """Forward and backward time per layer of ``model`` at ``batch`` on ``accelerator``.

    Args:
        model: the layer table.
        accelerator: peak FLOP/s and default efficiency.
        batch: samples per accelerator per iteration (>= 1).
        efficiency: fraction of peak achieved, in (0, 1]; default the accelerator's.
        measured_s: a measured iteration time (forward + backward); the per-layer times
            are scaled so that they sum to it.

    Example: ``iteration_time(get_model("resnet50"), get_accelerator("v100"), 256)``.
    """
    if batch < 1:
        raise ConfigError(f"batch must be at least 1, got {batch}")
    eff = accelerator.efficiency if efficiency is None else efficiency
    if not 0 < eff <= 1:
        raise ConfigError(f"efficiency must be in (0, 1], got {eff}")
    if measured_s is not None and not measured_s > 0:
        raise ConfigError(f"measured iteration time must be positive, got {measured_s}")
    rate = accelerator.peak_flops * eff
    forward = [layer.flops * batch / rate for layer in model.layers]
    scale = 1.0
    if measured_s is not None:
        estimated = (1 + BACKWARD_FACTOR) * sum(forward)
        if estimated <= 0:
            raise ConfigError(f"{model.name} has no FLOPs to scale to a measured time")
        scale = measured_s / estimated
    names = [layer.name for layer in model.layers]
    fwd = tuple((n, t * scale) for n, t in zip(names, forward))
    bwd = tuple((n, t * BACKWARD_FACTOR) for n, t in reversed(fwd))
    return IterationTime(model.name, accelerator.name, batch, eff, fwd, bwd, scale)


@dataclass(frozen=True)
class Bucket:
    """One gradient bucket: the layers it holds and when backward has produced all of them."""

    index: int                   # 0 = the first bucket backward fills
    layers: tuple[str, ...]      # in backward order
    params: int
    bytes: int
    ready_s: float               # seconds after backward started


def gradient_buckets(names: Sequence[str], params: Sequence[int], backward_s: Sequence[float],
                     cap_bytes: int = DDP_BUCKET_CAP_BYTES, first_cap_bytes: int | None = None,
                     bytes_per_param: int = 4) -> tuple[Bucket, ...]:
    """Group layers' gradients into buckets in backward order, as DDP does, with ready times.

    Inputs are parallel sequences in **backward order** (last layer first): layer names,
    parameters, and backward seconds. Steps:

    1. walk the layers, keeping the clock ``t`` = backward time elapsed when the layer's
       gradient is complete (the running sum of ``backward_s``);
    2. skip layers without parameters (their time still advances the clock);
    3. if the open bucket is not empty and the layer's gradient (``params x
       bytes_per_param``) would take it past its cap, close it; put the layer in the open
       bucket; the bucket's ``ready_s`` is ``t`` at its last layer;
    4. close the last bucket.

    A layer larger than the cap gets a bucket of its own (layers are never split, as DDP
    never splits a tensor). Unlike DDP, which closes a bucket only after it reaches the cap
    (so it may overshoot by one tensor), a bucket here never exceeds its cap unless it holds
    a single layer. The first bucket's cap is ``first_cap_bytes`` (default ``cap_bytes``;
    DDP uses ``DDP_FIRST_BUCKET_BYTES``, 1 MiB).
    """
    if not len(names) == len(params) == len(backward_s):
        raise ValueError("names, params and backward_s must have the same length")
    if cap_bytes < 1 or (first_cap_bytes is not None and first_cap_bytes < 1):
        raise ConfigError("bucket caps must be at least 1 byte")
    buckets: list[Bucket] = []
    open_names: list[str] = []
    open_params = 0
    ready = 0.0
    t = 0.0

    def close() -> None:
        buckets.append(Bucket(len(buckets), tuple(open_names), open_params,
                              open_params * bytes_per_param, ready))

    for name, n, dt in zip(names, params, backward_s):
        t += dt
        if n <= 0:
            continue
        cap = first_cap_bytes if (first_cap_bytes is not None and not buckets) else cap_bytes
        if open_names and (open_params + n) * bytes_per_param > cap:
            close()
            open_names, open_params = [], 0
        open_names.append(name)
        open_params += n
        ready = t
    if open_names:
        close()
    return tuple(buckets)


def model_buckets(model: ModelTable, timing: IterationTime,
                  cap_bytes: int = DDP_BUCKET_CAP_BYTES, first_cap_bytes: int | None = None,
                  bytes_per_param: int = 4) -> tuple[Bucket, ...]:
    """:func:`gradient_buckets` of ``model`` with the backward times of ``timing``."""
    params = {layer.name: layer.params for layer in model.layers}
    names = [name for name, _ in timing.backward]
    return gradient_buckets(names, [params[n] for n in names], [t for _, t in timing.backward],
                            cap_bytes, first_cap_bytes, bytes_per_param)
