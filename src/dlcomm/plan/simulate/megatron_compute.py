"""Per-layer compute of a Megatron-LM GPT on one tensor-parallel rank, kernel by kernel.

The layers are the catalog's (``dlcomm.workloads.catalog.transformer``); each is priced as
the kernels Megatron-LM (2021, with its fused kernels: Narayanan et al., SC'21, Sec. 4.2)
launches for it, with :class:`dlcomm.workloads.kernels.KernelModel`. Shapes per micro-batch
of b sequences of s tokens, width h, a heads, tensor parallelism t, vocabulary V, fp16
(2 bytes); "bsh" below is b s h elements. Forward, backward:

- ``ln_1``/``ln_2``/``ln_f``: LayerNorm, replicated on every TP rank (no sequence
  parallelism in 2021): reads and writes bsh; backward reads x and dy, writes dx; at the
  achieved bandwidth of Apex's layer-norm kernels (``NORM_FRACTION``);
- ``attn.qkv``: GEMM (bs x h) @ (h x 3h/t); backward: data gradient (bs x 3h/t) @ (3h/t x h)
  and weight gradient (h x bs) @ (bs x 3h/t);
- ``attn.core``: per head (a/t heads x b): Q K^T (s x h/a x s), the fused scale-mask-
  softmax (read + write s^2), attention dropout (read + write + a one-byte mask), then
  A V (s x s x h/a); backward: two batched GEMMs per product, softmax and dropout
  backward (read two, write one);
- ``attn.proj`` / ``mlp.proj``: row-parallel GEMM (bs x h/t) @ (h/t x h) or (4h/t), then
  the fused bias-dropout-add (read two bsh, write one, one-byte mask), replicated;
- ``mlp.fc``: GEMM (bs x h) @ (h x 4h/t), then the fused bias-GeLU (read + write 4bsh/t);
- ``wte``/``wpe``: the vocabulary-parallel lookup and the position add (memory);
- ``lm_head``: GEMM (bs x h) @ (h x V/t) and the vocabulary-parallel cross-entropy in
  float32 (logits converted, max, subtract, exp, sum, divide: ``CE_BYTES`` per logit
  forward, ``CE_BACKWARD_BYTES`` backward); backward two GEMMs.

With activation recomputation every transformer block's forward runs again at the start of
its backward (the embedding and the head are not recomputed). Every backward also adds each
weight gradient into the gradient accumulated over the micro-batches (autograd's fp16
accumulation: read both, write one, ``ACCUMULATE_BYTES`` per parameter of the rank).
"""

from __future__ import annotations

from dlcomm.workloads.catalog.transformer import TransformerConfig, transformer_layers
from dlcomm.workloads.kernels import KernelModel

__all__ = ["NORM_FRACTION", "CE_BYTES", "CE_BACKWARD_BYTES", "ACCUMULATE_BYTES",
           "gpt_layer_times"]

ELEM = 2                    # fp16
NORM_FRACTION = (0.576, 0.368)   # LayerNorm fwd / bwd: 896 / 572 GB/s of GA100's 1,555 GB/s
# (Apex FusedLayerNorm, NVIDIA/apex#1037, the kernels of 2021)
CE_BYTES = 2 + 4 + 4 + 8 + 8 + 4 + 8     # read fp16 + write fp32, max, sub, exp, sum, div
CE_BACKWARD_BYTES = 8 + 8 + 6            # softmax - one-hot, scale, back to fp16
ACCUMULATE_BYTES = 3 * ELEM              # grad += new grad, per parameter per micro-batch


def _blocks(km: KernelModel, cfg: TransformerConfig, b: float,
            t: int) -> dict[str, tuple[float, float]]:
    """(forward, backward) seconds of each kind of layer of one block (module docstring)."""
    s, h, a = cfg.seq, cfg.d, cfg.heads
    f = cfg.ffn
    rows, bsh = b * s, b * s * h
    heads, dh = b * a / t, h / a
    mem, gemm = km.memory, km.gemm
    peak = km.accelerator.memory_Bps

    def linear(n_in: float, n_out: float) -> tuple[float, float]:
        return (gemm(rows, n_out, n_in),
                gemm(rows, n_in, n_out) + gemm(n_in, n_out, rows))

    norm = (bsh * ELEM * 2 / (peak * NORM_FRACTION[0]) + km.launch_s,
            bsh * ELEM * 3 / (peak * NORM_FRACTION[1]) + km.launch_s)
    add_f, add_b = mem(bsh * (3 * ELEM + 1)), mem(bsh * (2 * ELEM + 1))
    sq = heads * s * s
    core_f = (gemm(s, s, dh, heads) + mem(sq * ELEM * 2) + mem(sq * (ELEM * 2 + 1))
              + gemm(s, dh, s, heads))
    # dQ = dS K and dK = dS^T Q (k = s), dA = dO V^T (k = h/a), dV = A^T dO (k = s)
    core_b = (gemm(s, s, dh, heads) + 3 * gemm(s, dh, s, heads) + mem(sq * ELEM * 3)
              + mem(sq * (ELEM * 2 + 1)))
    qkv, proj = linear(h, 3 * h / t), linear(h / t, h)
    fc, fc2 = linear(h, f / t), linear(f / t, h)
    gelu = (mem(b * s * f / t * ELEM * 2), mem(b * s * f / t * ELEM * 3))
    return {"ln": norm, "attn.qkv": qkv, "attn.core": (core_f, core_b),
            "attn.proj": (proj[0] + add_f, proj[1] + add_b),
            "mlp.fc": (fc[0] + gelu[0], fc[1] + gelu[1]),
            "mlp.proj": (fc2[0] + add_f, fc2[1] + add_b)}


def gpt_layer_times(cfg: TransformerConfig, km: KernelModel, micro_batch: float, tp: int,
                    recompute: bool = True) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of every catalog layer of ``cfg`` (forward order) for
    one micro-batch on one TP rank; with ``recompute`` a block layer's backward includes
    its forward again."""
    b, t = micro_batch, tp
    s, h, v = cfg.seq, cfg.d, cfg.vocab
    per = _blocks(km, cfg, b, t)
    bsh = b * s * h
    logits = b * s * v / t
    head = (km.gemm(b * s, v / t, h) + km.memory(logits * CE_BYTES, 6),
            km.gemm(b * s, h, v / t) + km.gemm(h, v / t, b * s)
            + km.memory(logits * CE_BACKWARD_BYTES, 3))
    special = {"wte": (km.memory(bsh * ELEM * 2), km.memory(bsh * ELEM * 2)),
               "wpe": (km.memory(bsh * ELEM * 3), km.memory(bsh * ELEM * 2)),
               "ln_f": per["ln"], "lm_head": head}
    fwd, bwd = [], []
    for layer in transformer_layers(cfg):
        if layer.name in special:
            f, bk = special[layer.name]
        else:
            kind = layer.name.split(".", 2)[2]          # h.<i>.<kind>
            f, bk = per["ln" if kind.startswith("ln") else kind]
            if recompute:
                bk += f
        split = layer.kind == "linear" or layer.name == "wte"   # wpe is replicated
        shard = layer.params / t if split else layer.params
        fwd.append(f)
        bwd.append(bk + km.memory(shard * ACCUMULATE_BYTES))
    return fwd, bwd
