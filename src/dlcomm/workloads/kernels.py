"""Kernel-level compute time on an accelerator: GEMMs by tiles and waves, the rest by bytes.

A flat efficiency (``Accelerator.efficiency``) prices every FLOP alike; real iterations are
not alike: small or oddly shaped matrix products leave streaming multiprocessors idle, and
layer norms, softmax, dropout and activations move bytes, not FLOPs. The model (NVIDIA,
"Matrix Multiplication Background User's Guide": tile and wave quantization; the roofline):

1. a GEMM C (m x n) = A (m x k) B (k x n), ``batch`` times, is cut into output tiles of
   t_m x t_n (256 x 128, 128 x 256 or 128 x 128, whichever finishes first); the tiles run
   in waves of one per SM, so it takes ``ceil(tiles / sms)`` waves of
   ``2 t_m t_n (k + K_FILL) / (peak / sms x ceiling)`` seconds: ``ceiling`` is the best
   fraction of peak measured for large GEMMs on that chip (docs/simulation.md: A100
   230 TFLOPS in the CUDA 11 era, H100 794 TFLOPS), and ``K_FILL`` the depth a tile's
   pipeline spends filling before it multiplies (a typical CUTLASS Ampere configuration:
   64-deep k tiles in 3 stages, two of them loaded ahead: 128), which is what makes GEMMs with a
   short k (attention's head width, tensor-parallel shards) slow;
2. it cannot beat its memory traffic either: ``bytes x (m k + k n + m n) x batch /
   (memory bandwidth x memory_ceiling)``; the GEMM takes the larger of the two;
3. a memory-bound kernel (norms, softmax, dropout, fused bias + activation, residual adds,
   the optimizer) takes ``bytes moved / (memory bandwidth x memory_ceiling)``, where
   ``memory_ceiling`` is the fraction of the datasheet bandwidth streaming kernels achieve
   (docs/simulation.md gives the measurements it comes from);
4. every kernel pays ``LAUNCH_S`` (the gap between back-to-back kernels on one stream).

Nothing here is fitted to the training throughputs it is checked against (docs/
simulation.md: Megatron-LM). Accelerators without the kernel-level facts (``sms``, memory
bandwidth, ceilings) raise a clear error: use the flat model for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlcomm.errors import ConfigError
from dlcomm.workloads.accelerators import Accelerator

__all__ = ["LAUNCH_S", "K_FILL", "TILES", "KernelModel", "gemm_s", "memory_s"]

LAUNCH_S = 4e-6                     # back-to-back kernel gap on one CUDA stream
K_FILL = 128                        # k-depth of a tile's pipeline fill (step 1)
TILES = ((256, 128), (128, 256), (128, 128))   # cuBLAS/CUTLASS tiles for large fp16 GEMMs


@dataclass(frozen=True)
class KernelModel:
    """An accelerator seen through the kernel model (module docstring)."""

    accelerator: Accelerator
    launch_s: float = LAUNCH_S

    def __post_init__(self) -> None:
        acc = self.accelerator
        if not (acc.sms > 0 and acc.memory_Bps > 0 and 0 < acc.gemm_ceiling <= 1
                and 0 < acc.memory_ceiling <= 1):
            raise ConfigError(f"accelerator {acc.name!r} lacks the kernel-model facts "
                              "(sms, memory bandwidth, GEMM and memory ceilings; a100 and "
                              "h100 have them)")

    @property
    def memory_rate(self) -> float:
        """Bytes/s a streaming kernel achieves."""
        return self.accelerator.memory_Bps * self.accelerator.memory_ceiling

    def gemm(self, m: float, n: float, k: float, batch: float = 1,
             elem_bytes: int = 2) -> float:
        """Seconds of ``batch`` GEMMs of (m x k) @ (k x n) (steps 1, 2 and 4)."""
        if min(m, n, k, batch) <= 0:
            return 0.0
        acc = self.accelerator
        per_sm = acc.peak_flops * acc.gemm_ceiling / acc.sms
        compute = min(math.ceil(batch * math.ceil(m / tm) * math.ceil(n / tn) / acc.sms)
                      * 2.0 * tm * tn * (k + K_FILL) / per_sm for tm, tn in TILES)
        traffic = elem_bytes * (m * k + k * n + m * n) * batch / self.memory_rate
        return max(compute, traffic) + self.launch_s

    def memory(self, nbytes: float, kernels: int = 1) -> float:
        """Seconds of memory-bound kernels moving ``nbytes`` in all (steps 3 and 4)."""
        if nbytes <= 0:
            return 0.0
        return nbytes / self.memory_rate + kernels * self.launch_s


def gemm_s(acc: Accelerator, m: float, n: float, k: float, batch: float = 1) -> float:
    """:meth:`KernelModel.gemm` on ``acc``."""
    return KernelModel(acc).gemm(m, n, k, batch)


def memory_s(acc: Accelerator, nbytes: float) -> float:
    """:meth:`KernelModel.memory` on ``acc``."""
    return KernelModel(acc).memory(nbytes)
