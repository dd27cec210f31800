"""Accelerators: peak throughput, memory and links, for compute-time and partition models.

Every figure is the vendor's datasheet value for one chip at the usual training precision
(dense, no sparsity), with its source. Training rarely runs at peak: ``efficiency`` is the
achievable fraction of peak assumed by default (model-FLOPs utilisation of well-tuned
large-model training is typically 30-50%), overridable per call or per file.

User-defined accelerators come from a JSON or TOML file::

    [accelerators.my-npu]
    peak_flops = 2.0e14
    memory_gb = 48
    scaleup_gbps = 800
    scaleout_gbps = 200
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from dlcomm.errors import ConfigError
from dlcomm.registry import Registry
from dlcomm.results import read_table_file

__all__ = ["Accelerator", "ACCELERATORS", "get_accelerator", "load_accelerators",
           "DEFAULT_EFFICIENCY", "NodeSpec", "NODES"]

DEFAULT_EFFICIENCY = 0.4


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_flops: float        # dense FLOP/s at training precision (fp16/bf16 tensor cores, MXU)
    memory_bytes: float      # device memory
    scaleup_gbps: float      # chip-to-chip bandwidth per chip (NVLink, TPU ICI), Gbit/s, one way
    scaleout_gbps: float     # network bandwidth per chip (NIC), Gbit/s, one way
    efficiency: float = DEFAULT_EFFICIENCY  # achievable fraction of peak in training
    source: str = ""
    # for the kernel-level compute model (dlcomm.workloads.kernels); 0 = unknown
    memory_Bps: float = 0.0   # device-memory (HBM) bandwidth, bytes/s
    sms: int = 0              # streaming multiprocessors (GEMM tiles run one wave per SM)
    gemm_ceiling: float = 0.0  # best measured fraction of peak of a large GEMM
    memory_ceiling: float = 0.0  # achieved fraction of memory bandwidth of streaming kernels

    def time_for(self, flops: float, efficiency: float | None = None) -> float:
        """Seconds to execute ``flops`` at ``efficiency`` x peak."""
        return flops / (self.peak_flops * (efficiency or self.efficiency))


ACCELERATORS: Registry[Accelerator] = Registry("accelerator")

_BUILTIN = [
    Accelerator("v100", 125e12, 32 * 2**30, 300 * 8 / 2, 100,
                source="NVIDIA V100 datasheet: 125 TFLOPS fp16 tensor, 32 GB HBM2, "
                       "NVLink 300 GB/s total (150 GB/s each way); 100 Gb/s NIC per GPU "
                       "as in DGX-1 class clusters"),
    Accelerator("a100", 312e12, 80 * 2**30, 600 * 8 / 2, 200,
                source="NVIDIA A100 80GB SXM datasheet: 312 TFLOPS bf16 dense, 80 GB HBM2e at "
                       "2,039 GB/s, 108 SMs, NVLink 600 GB/s total; 200 Gb/s HDR NIC per GPU "
                       "(DGX A100). GEMM ceiling 230 TFLOPS, the best square fp16 matmul with "
                       "CUDA 11 (transformers-benchmarks; 271 with today's cuBLAS, the "
                       "ml-engineering MAMF table); streaming 88%: docs/simulation.md",
                memory_Bps=2039e9, sms=108, gemm_ceiling=230 / 312, memory_ceiling=0.88),
    Accelerator("h100", 989e12, 80 * 2**30, 900 * 8 / 2, 400,
                source="NVIDIA H100 SXM datasheet: 989 TFLOPS bf16 dense, 80 GB HBM3 at "
                       "3,350 GB/s, 132 SMs, NVLink 900 GB/s total; 400 Gb/s NDR NIC per GPU "
                       "(DGX H100). Largest-GEMM ceiling 794 TFLOPS (80.3%) measured "
                       "(ml-engineering MAMF table); streaming ceiling: docs/simulation.md",
                memory_Bps=3350e9, sms=132, gemm_ceiling=0.803, memory_ceiling=0.90),
    Accelerator("tpu-v2", 45e12, 16 * 2**30, 496, 100,
                source="Google Cloud TPU v2 chip: 45 TFLOPS bf16, 16 GiB HBM; ICI per chip "
                       "(unverified: 4 links x 62 Gb/s x 2 directions ~ 496 Gb/s)"),
    Accelerator("tpu-v3", 123e12, 32 * 2**30, 656, 100,
                source="Google Cloud TPU v3 chip: 123 TFLOPS bf16, 32 GiB HBM; ICI per chip "
                       "(unverified: 4 links x 82 Gb/s x 2 directions ~ 656 Gb/s)"),
]
for _acc in _BUILTIN:
    ACCELERATORS.register(_acc.name, _acc.source.split(":")[0])(lambda acc=_acc: acc)


def get_accelerator(name: str, efficiency: float | None = None) -> Accelerator:
    """A built-in accelerator, optionally with another default efficiency."""
    acc = ACCELERATORS.get(name)()
    if efficiency is not None:
        if not 0 < efficiency <= 1:
            raise ConfigError(f"efficiency must be in (0, 1], got {efficiency}")
        acc = replace(acc, efficiency=efficiency)
    return acc


def load_accelerators(path: str | Path) -> dict[str, Accelerator]:
    """User-defined accelerators from a JSON or TOML file (table ``accelerators``)."""
    p = Path(path)
    data = read_table_file(p, "accelerator file")
    table = data.get("accelerators")
    if not isinstance(table, dict):
        raise ConfigError(f"accelerator file {p} needs a table 'accelerators'")
    out = {}
    for name, spec in table.items():
        try:
            out[name] = Accelerator(
                name, float(spec["peak_flops"]), float(spec["memory_gb"]) * 2**30,
                float(spec.get("scaleup_gbps", 0)), float(spec.get("scaleout_gbps", 0)),
                float(spec.get("efficiency", DEFAULT_EFFICIENCY)), str(spec.get("source", p)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"accelerator file {p}: entry {name!r} is invalid ({exc})") from exc
        if not (out[name].peak_flops > 0 and 0 < out[name].efficiency <= 1):
            raise ConfigError(f"accelerator file {p}: entry {name!r} needs peak_flops > 0 "
                              "and 0 < efficiency <= 1")
    return out


@dataclass(frozen=True)
class NodeSpec:
    """A server of accelerators: a scale-up domain (NVLink/NVSwitch) and NICs to the fabric.

    Rates are line rates per accelerator, one direction; ``*_efficiency`` is the share of
    the line rate that collectives achieve on that link (protocol overheads), as the
    vendor's engineers state it (docs/simulation.md, "Nodes and links").
    """

    name: str
    accelerator: str
    gpus: int                   # accelerators per node
    scaleup_gbps: float         # NVLink per accelerator, one direction (Gb/s)
    scaleup_efficiency: float
    nic_gbps: float             # one NIC per accelerator, one direction (Gb/s)
    nic_efficiency: float
    switches: int               # NVSwitch chips per node
    source: str = ""


NODES: Registry[NodeSpec] = Registry("node")
_NODES = [
    NodeSpec("dgx-a100", "a100", 8, 12 * 25 * 8, 0.8, 200, 0.96, 6,
             source="DGX A100: 8 A100 80GB, 12 NVLink3 links x 25 GB/s per direction per GPU "
                    "through 6 NVSwitches, ~20 GB/s effective per link (S. Jeaugey, NVIDIA, "
                    "nccl-tests#149); 8 HDR 200 Gb/s HCAs for compute, 24 GB/s per NIC "
                    "achievable (nccl-tests#119)"),
    NodeSpec("dgx-h100", "h100", 8, 450 * 8, 370 / 450, 400, 47 / 50, 4,
             source="DGX H100: 8 H100 SXM, NVLink4 450 GB/s per direction per GPU, ~20% "
                    "protocol overhead: ~370 GB/s effective (nccl-tests#212); 8 ConnectX-7 "
                    "NDR 400 Gb/s, 46-48 GB/s per NIC (nccl-tests#290)"),
]
for _node in _NODES:
    NODES.register(_node.name, _node.source.split(":")[0])(lambda node=_node: node)
