"""Deep-learning traffic per iteration: which collectives, how big, how often.

For a model's layer table (``dlcomm.workloads.catalog``) and a parallelism DP x PP x TP
(+ MoE expert parallelism EP, + DLRM-style sharded embeddings), following the HammingMesh
paper (docs/references.md):

- pipeline (PP): layers are cut into ``pp`` contiguous stages of about equal forward
  FLOPs, each cut moved (within a quarter stage) to the smallest activation; at every
  stage boundary each micro-batch sends its activations forward and their gradients
  backward: 2 M point-to-point messages of (out_elems x micro-batch x bytes /
  tp) per iteration (with TP, each TP rank sends its 1/tp slice, as Megatron-LM does);
- tensor (TP): the parametric linear/conv layers of a stage pair up as (column-parallel,
  row-parallel); each pair all-reduces its output forward and its input gradient
  backward in groups of ``tp`` (2 forward + 2 backward per transformer block); a
  vocabulary-parallel (token) embedding all-reduces its output forward (position and type
  embeddings are replicated);
- data (DP): one all-reduce per iteration of the gradients a rank holds (its stage's
  parameters, the TP-split ones divided by ``tp``) in groups of ``dp``;
- experts (EP, ``ep`` > 1): every ``moe_every``-th MLP pair (first layer named *mlp*,
  *fc*, *ffn*, *expert* or *moe*) becomes a mixture-of-experts layer with one expert per
  rank of an EP group (EP groups are drawn from the DP dimension); per micro-batch 2
  all-to-alls forward (dispatch, combine) and 2 backward of the layer's tokens x width;
  expert gradients are all-reduced among the dp/ep replicas of an expert instead of dp;
- recommenders (``family == "recommender"``): embedding tables are sharded over all
  ranks (model parallel), so each iteration does 2 all-to-alls (pooled embeddings
  forward, their gradients backward) of batch x embedding outputs; the dense layers are
  data parallel.

Sizes are bytes per rank: the buffer of an all-reduce, what a rank contributes to an
all-to-all (it keeps 1/g), one message of a point-to-point transfer. ``calls`` are per
iteration; ``nbytes`` is the mean over calls (the cost models are affine in the size, so
calls x time(mean) is the total).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.registry import parse_spec
from dlcomm.workloads.catalog.base import Layer, ModelTable

__all__ = ["Parallelism", "parse_parallelism", "Comm", "iteration_traffic", "stages"]

_TP_KINDS = ("linear", "conv")
_MLP_WORDS = ("mlp", "fc", "ffn", "expert", "moe")


@dataclass(frozen=True)
class Parallelism:
    dp: int = 1            # data-parallel replicas
    pp: int = 1            # pipeline stages
    tp: int = 1            # tensor-parallel ranks per stage
    ep: int = 1            # expert-parallel group size (drawn from dp)
    micro: int = 0         # micro-batches per iteration (0: pp if pp > 1 else 1)
    batch: int = 0         # samples per DP replica per iteration (0: model default x pp)
    moe_every: int = 2     # every n-th MLP becomes an MoE layer when ep > 1
    bytes: int = 2         # bytes per gradient/activation element (bf16/fp16)

    def __post_init__(self) -> None:
        for key in ("dp", "pp", "tp", "ep", "moe_every", "bytes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"parallelism {key} must be >= 1, got {getattr(self, key)}")
        if self.micro < 0 or self.batch < 0:
            raise ConfigError("parallelism micro and batch must be >= 0")
        if self.dp % self.ep:
            raise ConfigError(f"ep={self.ep} must divide dp={self.dp}")

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def micro_batches(self) -> int:
        return self.micro or (self.pp if self.pp > 1 else 1)

    def resolved(self, model: ModelTable) -> Parallelism:
        batch = self.batch or model.default_batch * self.pp
        return replace(self, batch=batch, micro=self.micro_batches)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_parallelism(text: str) -> Parallelism:
    """``dp=64,pp=4,tp=4[,ep=8,micro=16,batch=512,moe_every=2,bytes=2]`` or ``64x4x4``
    (dp x pp x tp)."""
    text = text.strip()
    if text and "=" not in text:
        parts = text.lower().split("x")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise ConfigError(f"bad parallelism {text!r} (e.g. dp=64,pp=4,tp=4 or 64x4x4)") \
                from None
        if not 1 <= len(values) <= 3:
            raise ConfigError(f"bad parallelism {text!r}: DP[xPPxTP]")
        return Parallelism(*values)
    spec = parse_spec("p:" + text)
    allowed = {f for f in Parallelism.__dataclass_fields__}
    values = {}
    for key, value in spec.options.items():
        if key not in allowed:
            raise ConfigError(f"unknown parallelism option {key!r} "
                              f"(options: {', '.join(sorted(allowed))})")
        try:
            values[key] = int(value)
        except ValueError:
            raise ConfigError(f"parallelism {key} must be an integer, got {value!r}") from None
    return Parallelism(**values)


@dataclass(frozen=True)
class Comm:
    dim: str          # dp | dp-expert | tp | pp | ep | embedding
    op: str           # allreduce | alltoall | p2p
    group: int        # ranks per group
    nbytes: float     # bytes per rank per call (mean over calls)
    calls: int        # per iteration
    note: str = ""

    @property
    def total_bytes(self) -> float:
        return self.nbytes * self.calls

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_bytes": self.total_bytes}


def stages(model: ModelTable, pp: int) -> list[tuple[Layer, ...]]:
    """Contiguous stages of about equal forward FLOPs (a stage is never empty)."""
    layers = model.layers
    if pp > len(layers):
        raise ConfigError(f"pp={pp} exceeds the {len(layers)} layers of {model.name}")
    weights = [max(l.flops, 0.0) for l in layers]
    if sum(weights) <= 0:
        weights = [1.0] * len(layers)
    total = sum(weights)
    cuts, acc = [], 0.0
    for i, w in enumerate(weights):
        acc += w
        left = len(layers) - (i + 1)
        need = pp - 1 - len(cuts)
        if need and (acc >= total * (len(cuts) + 1) / pp or left == need):
            cuts.append(i + 1)
    # move each cut, within a quarter stage, to where the activation crossing it is smallest
    window = max(1, len(layers) // (4 * pp))
    for k, cut in enumerate(cuts):
        low = max(cuts[k - 1] + 1 if k else 1, cut - window)
        high = min(cuts[k + 1] - 1 if k + 1 < len(cuts) else len(layers) - 1, cut + window)
        cuts[k] = min(range(low, high + 1),
                      key=lambda c: (layers[c - 1].out_elems, abs(c - cut)))
    bounds = [0, *cuts, len(layers)]
    return [tuple(layers[a:b]) for a, b in zip(bounds, bounds[1:])]


def _pairs(layers: tuple[Layer, ...]) -> list[tuple[int, int | None]]:
    """(column-parallel, row-parallel) layer indices over the whole model, so that a
    stage cut inside a block does not shift the pairing."""
    tp = [i for i, l in enumerate(layers) if l.kind in _TP_KINDS and l.params > 0]
    return [(tp[k], tp[k + 1] if k + 1 < len(tp) else None) for k in range(0, len(tp), 2)]


def _is_mlp(layer: Layer) -> bool:
    return any(word in layer.name.lower() for word in _MLP_WORDS)


def vocab_parallel(layer: Layer) -> bool:
    """A token embedding: TP splits its rows and all-reduces its output; embeddings added
    to one (positions, segment types) are replicated on every TP rank (Megatron-LM)."""
    return layer.kind == "embedding" and layer.shortcut_from is None


def _rank_params(stage: tuple[Layer, ...], tp: int) -> float:
    return sum(l.params / tp if l.kind in _TP_KINDS or vocab_parallel(l) else l.params
               for l in stage)


def iteration_traffic(model: ModelTable, par: Parallelism) -> list[Comm]:
    """The communication of one training iteration (module docstring)."""
    par = par.resolved(model)
    nbytes, m = par.bytes, par.micro_batches
    mb = par.batch / m
    if mb <= 0:
        raise ConfigError("the batch per replica must be >= 1 sample")
    if model.family == "recommender":
        return _recommender(model, par)
    out: list[Comm] = []
    parts = stages(model, par.pp)
    worst: dict[str, list[float]] = {}

    def keep(key: str, calls: int, total: float) -> None:
        if calls and total >= worst.get(key, [0, -1.0])[1]:
            worst[key] = [calls, total]

    layers = model.layers
    pairs = _pairs(layers)
    mlp = [p for p in pairs if p[1] is not None and _is_mlp(layers[p[0]])]
    moe = set(mlp[par.moe_every - 1::par.moe_every]) if par.ep > 1 else set()
    start = 0
    for stage in parts:
        end = start + len(stage)
        mine = [p for p in pairs if start <= p[0] < end]
        experts = [p for p in mine if p in moe]
        expert_params = sum(layers[a].params + layers[b].params for a, b in experts) / par.tp
        keep("dp", 1, (_rank_params(stage, par.tp) - expert_params) * nbytes)
        keep("dp-expert", 1 if experts else 0, expert_params * nbytes)
        if par.tp > 1:
            calls, total = 0, 0.0
            for a, b in mine:
                last = layers[a if b is None else b]
                calls += 2 * m
                total += m * (last.out_elems + layers[a].in_elems) * mb * nbytes
            emb = [l for l in stage if vocab_parallel(l)]
            calls += len(emb) * m
            total += sum(l.out_elems for l in emb) * mb * m * nbytes
            keep("tp", calls, total)
        if experts:
            total = sum(layers[a].in_elems + layers[b].out_elems
                        for a, b in experts) * 2 * mb * m * nbytes / par.tp
            keep("ep", 4 * m * len(experts), total)
        start = end
    for stage in parts[:-1]:
        keep("pp", 2 * m, 2 * m * stage[-1].out_elems * mb * nbytes / par.tp)
    groups = {"dp": par.dp, "dp-expert": par.dp // par.ep, "tp": par.tp, "pp": par.pp,
              "ep": par.ep}
    ops = {"dp": "allreduce", "dp-expert": "allreduce", "tp": "allreduce", "pp": "p2p",
           "ep": "alltoall"}
    notes = {"dp": "gradients of the largest stage", "dp-expert": "expert gradients",
             "tp": "activations of the busiest stage", "pp": "largest stage boundary",
             "ep": "MoE dispatch + combine"}
    for key in ("dp", "dp-expert", "tp", "pp", "ep"):
        if key in worst and groups[key] > 1:
            calls, total = worst[key]
            out.append(Comm(key, ops[key], groups[key], total / calls, int(calls), notes[key]))
    return out


def _recommender(model: ModelTable, par: Parallelism) -> list[Comm]:
    if par.pp > 1 or par.tp > 1:
        raise ConfigError(f"{model.name} is a recommender: use dp only (its embeddings "
                          "are sharded over all ranks)")
    emb = [l for l in model.layers if l.kind == "embedding"]
    dense = sum(l.params for l in model.layers if l.kind != "embedding")
    out = []
    if par.dp > 1 and emb:
        size = par.batch * sum(l.out_elems for l in emb) * par.bytes
        out.append(Comm("embedding", "alltoall", par.dp, size, 2,
                        "pooled embeddings forward, their gradients backward"))
    if par.dp > 1 and dense:
        out.append(Comm("dp", "allreduce", par.dp, dense * par.bytes, 1,
                        "dense-layer gradients"))
    return out
