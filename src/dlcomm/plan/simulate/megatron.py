"""``dlcomm simulate reproduce megatron``: GPT training on Selene against Megatron-LM's
published throughput (Narayanan et al., SC'21, Table 1, and its 175B runs).

Every row is simulated as the paper ran it, nothing fitted to the rows:

1. the model: the catalog's GPT layer table with the row's layers l, width h, heads a,
   sequence 2048 and vocabulary 51,200;
2. the cluster: ``nodes:n=N,node=dgx-a100`` (8 A100 80GB per node on NVSwitch, 8 HDR
   NICs on a non-blocking fat tree; :mod:`dlcomm.plan.topology.nodes`);
3. the split: tensor parallelism t inside a node, pipeline p, data parallelism
   d = N / (t p), micro-batches of b sequences (NVIDIA's scripts for the paper, docs/
   references.md), m = B / (d b) per pipeline; the interleaved 1F1B schedule with v model
   chunks where the scripts use it; transformer blocks split evenly over the p v virtual
   stages, the embedding on the first, the final norm and the LM head on the last;
4. compute: kernel by kernel (:mod:`.megatron_compute` on
   :class:`dlcomm.workloads.kernels.KernelModel`), full activation recomputation (each
   block's forward, with its two tensor-parallel all-reduces, again in its backward);
5. communication on the fluid network: tensor-parallel all-reduces inside the node,
   pipeline transfers of bsh/t per micro-batch (the scatter/gather optimization), the
   data-parallel all-reduce of the fp16 gradients (NCCL's rings): overlapped with the
   backward in 25 MiB buckets where the scripts use PyTorch's DDP (``torch``), after the
   last backward where they use Megatron's own (``local``);
6. the optimizer: Adam with fp32 master weights, ``OPTIMIZER_BYTES`` per parameter of the
   rank, memory-bound, after the gradients;
7. throughput per GPU = F / (N x iteration), F the paper's Eq. 3,
   96 B s l h^2 (1 + s / 6h + V / 16 l h), as the paper computes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan.commtime import place_ranks
from dlcomm.plan.simulate.collective import Collectives, ExchangeModel
from dlcomm.plan.simulate.fluid import SimNetwork
from dlcomm.plan.simulate.megatron_compute import gpt_layer_times
from dlcomm.plan.simulate.plans import StagePlanner, run_plans
from dlcomm.plan.topology import build_topology
from dlcomm.plan.traffic import Parallelism
from dlcomm.results import new_result
from dlcomm.workloads.accelerators import NODES, get_accelerator
from dlcomm.workloads.catalog.base import Layer, ModelTable
from dlcomm.workloads.catalog.transformer import TransformerConfig, transformer_layers
from dlcomm.workloads.kernels import KernelModel

__all__ = ["MegatronRow", "TABLE1", "GPT3_ROWS", "megatron_flops", "simulate_row",
           "reproduce_megatron", "OPTIMIZER_BYTES"]

SEQ, VOCAB = 2048, 51200
MODERN_A100_CEILING = 271.2 / 312   # today's cuBLAS (the ml-engineering MAMF table)
OPTIMIZER_BYTES = (2 + 4) + 8 + 4 + 28 + (4 + 2)   # fp16 grad -> fp32, unscale, norm, Adam
# (read master, grad, m, v; write master, m, v), fp16 copy of the weights: 52 per parameter


@dataclass(frozen=True)
class MegatronRow:
    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    published_tflops: float
    micro_batch: int
    chunks: int = 1             # model chunks per device (interleaved schedule)
    ddp: str = "local"          # torch: buckets overlap the backward; local: after it
    source: str = "Table 1"

    @property
    def dp(self) -> int:
        if self.gpus % (self.tp * self.pp) or self.gpus < self.tp * self.pp:
            raise ConfigError(f"{self.gpus} GPUs do not split into tp {self.tp} x pp "
                              f"{self.pp} groups")
        return self.gpus // (self.tp * self.pp)

    @property
    def micro_batches(self) -> int:
        return self.batch // (self.dp * self.micro_batch)

    def config(self) -> TransformerConfig:
        h = self.hidden
        return TransformerConfig("gpt", VOCAB, SEQ, h, self.layers, self.heads, 4 * h, SEQ)


# Narayanan et al., SC'21, Table 1 (weak scaling); micro-batch, chunks and DDP from NVIDIA's
# examples/sc21/run_table_1.sh (docs/references.md)
TABLE1 = (
    MegatronRow(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, ddp="torch"),
    MegatronRow(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, ddp="torch"),
    MegatronRow(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, ddp="torch"),
    MegatronRow(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, ddp="torch"),
    MegatronRow(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4),
    MegatronRow(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, chunks=3),
    MegatronRow(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, chunks=2),
    MegatronRow(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, chunks=2),
    MegatronRow(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, chunks=3),
    MegatronRow(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1),
)
# GPT-3 175B: the Megatron-LM README's run (TP 8, PP 16, 1,024 GPUs, 138 TF/s) and Table 2's
# PTD-P rows (model-parallel size 96, split 8 x 12 as in the paper's Fig. 12 scripts)
GPT3_ROWS = (
    MegatronRow(174.6, 96, 12288, 96, 8, 16, 1024, 1536, 138, 1, source="README"),
    MegatronRow(174.6, 96, 12288, 96, 8, 12, 384, 1536, 153, 1, source="Table 2"),
    MegatronRow(174.6, 96, 12288, 96, 8, 12, 768, 1536, 149, 1, source="Table 2"),
    MegatronRow(174.6, 96, 12288, 96, 8, 12, 1536, 1536, 141, 1, source="Table 2"),
)

Say = Callable[[str], None] | None


def megatron_flops(row: MegatronRow) -> float:
    """FLOPs per iteration, the paper's Eq. 3 (with activation recomputation)."""
    b, s, l, h, v = row.batch, SEQ, row.layers, row.hidden, VOCAB
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def _parts(row: MegatronRow, layers: tuple[Layer, ...]) -> list[tuple[int, int]]:
    """Layer ranges per virtual stage: blocks evenly, embedding first, head last (step 3)."""
    virtual = row.pp * row.chunks
    if row.layers % virtual:
        raise ConfigError(f"{row.layers} layers do not split into {virtual} virtual stages")
    first = [i for i, layer in enumerate(layers) if layer.name.startswith("h.0.")]
    per = row.layers // virtual * len(first)           # catalog layers per virtual stage
    bounds = [0] + [first[0] + per * (k + 1) for k in range(virtual - 1)] + [len(layers)]
    return list(zip(bounds, bounds[1:]))


def simulate_row(row: MegatronRow, node: str = "dgx-a100",
                 gemm_ceiling: float | None = None) -> dict[str, Any]:
    """Simulate one row (module docstring; ``gemm_ceiling`` replaces the chip's); returns
    its predicted throughput and parts."""
    t0 = time.perf_counter()
    spec = NODES.get(node)()
    acc = get_accelerator(spec.accelerator)
    km = KernelModel(acc if gemm_ceiling is None else replace(acc, gemm_ceiling=gemm_ceiling))
    cfg = row.config()
    layers = transformer_layers(cfg)
    model = ModelTable(f"gpt-{row.params_b:g}b", "transformer", layers, f"{SEQ} tokens",
                       row.params_b * 1e9, row.source, row.micro_batch)
    m = row.micro_batches
    if m < 1 or row.batch % (row.dp * row.micro_batch):
        raise ConfigError(f"batch {row.batch} does not split into micro-batches of "
                          f"{row.micro_batch} over {row.dp} replicas")
    par = Parallelism(dp=row.dp, pp=row.pp, tp=row.tp, micro=m,
                      batch=row.batch // row.dp, bytes=2)
    topo = build_topology(f"nodes:n={row.gpus},node={node}")
    net = SimNetwork(topo, place_ranks(par, topo.accelerators, "linear", 0))
    coll = Collectives(net, par, ExchangeModel(), "nccl", 1e-6, 0.5e-6)
    fwd, bwd = gpt_layer_times(cfg, km, row.micro_batch, row.tp, recompute=True)
    cap = 25 * 2**20 if row.ddp == "torch" else 2**62
    parts = _parts(row, layers)
    planner = StagePlanner(model, par, coll, fwd, bwd, False, cap, parts=parts, recompute=True)
    plans = planner.plans()
    schedule = "interleaved" if row.chunks > 1 else "1f1b"
    timeline, pipeline_s = run_plans(net, planner, plans, m, schedule, row.chunks,
                                     defer=row.ddp == "local")
    rank_params = max(sum(l.params for c in range(row.chunks)
                          for l in layers[slice(*parts[c * row.pp + d])])
                      for d in range(row.pp))
    optimizer = km.memory(rank_params / row.tp * OPTIMIZER_BYTES, 8)
    iteration = timeline.iteration_s + optimizer
    predicted = megatron_flops(row) / (row.gpus * iteration) / 1e12
    compute = max(st.compute_s for st in timeline.stages)
    return {"row": asdict(row), "dp": row.dp, "micro_batches": m,
            "iteration_s": iteration, "compute_s": compute,
            "bubble_s": max(pipeline_s - compute, 0.0),
            "exposed_comm_s": max(timeline.iteration_s - pipeline_s, 0.0),
            "optimizer_s": optimizer,
            "blocking_comm_s": max(sum(st.blocking_comm_s.values()) for st in timeline.stages),
            "predicted_tflops": predicted, "published_tflops": row.published_tflops,
            "error": predicted / row.published_tflops - 1,
            "simulate_s": time.perf_counter() - t0}


def reproduce_megatron(say: Say = None, rows: tuple[MegatronRow, ...] = TABLE1 + GPT3_ROWS,
                       node: str = "dgx-a100",
                       sensitivity: tuple[int, ...] = (0, 3, 6, 9)) -> dict[str, Any]:
    """Predicted against published TF/s per GPU for every row (module docstring), and the
    ``sensitivity`` rows again at today's A100 GEMM ceiling (``MODERN_A100_CEILING``)."""
    start = time.perf_counter()
    out = []
    for row in rows:
        r = simulate_row(row, node)
        out.append(r)
        if say:
            say(f"{row.params_b:g}B t={row.tp} p={row.pp} v={row.chunks} N={row.gpus} "
                f"B={row.batch}: {r['predicted_tflops']:.0f} TF/s per GPU predicted, "
                f"{row.published_tflops:g} published ({r['error']:+.1%}), "
                f"{r['iteration_s']:.1f} s per iteration")
    result = new_result("simulate-reproduce", {"reproduction": "megatron", "node": node,
                                               "rows": len(rows)})
    result["rows"] = out
    again = []
    for i in (i for i in sensitivity if i < len(rows)):
        r = simulate_row(rows[i], node, MODERN_A100_CEILING)
        again.append({"params_b": rows[i].params_b, "source": rows[i].source,
                      "predicted_tflops": r["predicted_tflops"], "error": r["error"]})
        if say:
            say(f"{rows[i].params_b:g}B at a {MODERN_A100_CEILING * 312:.0f} TFLOPS GEMM "
                f"ceiling: {r['predicted_tflops']:.0f} TF/s per GPU ({r['error']:+.1%})")
    errors = [abs(r["error"]) for r in out]
    result["summary"] = {"max_abs_error": max(errors), "within_10pct": sum(e <= 0.10
                                                                         for e in errors),
                         "rows": len(out),
                         "gemm_ceiling_sensitivity": {"gemm_ceiling": MODERN_A100_CEILING,
                                                      "rows": again},
                         "published": "Narayanan et al., SC'21, Table 1 (A100 80GB, Selene) "
                                      "and the 175B runs (README, Table 2)",
                         "wall_time_s": time.perf_counter() - start}
    return result
