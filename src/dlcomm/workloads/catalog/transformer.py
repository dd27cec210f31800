"""Transformer layer tables (BERT, GPT-2, GPT-3) from closed-form formulas.

A sample is one sequence of ``s`` tokens; ``area`` is ``s`` for every per-token layer. With
model width ``d`` and feed-forward width ``f`` (4d), one block is (pre-LN for GPT, post-LN
for BERT; the residual additions are folded into the projection they follow):

====================  ==============  =======================================
layer                 params          forward FLOPs per sequence
====================  ==============  =======================================
ln                    2d              NORM_FLOPS s d
attn.qkv              3d^2 + 3d       2 s d 3d
attn.core             0               2 s^2 d (Q K^T) + 2 s^2 d (A V) = 4 s^2 d
attn.proj             d^2 + d         2 s d^2 + s d (residual add)
mlp.fc                d f + f         2 s d f + s f (GELU, 1 per element)
mlp.proj              f d + d         2 s f d + s d (residual add)
====================  ==============  =======================================

so a block has 12 d^2 + 13 d parameters (f = 4d), the layout of torch's own
``nn.TransformerEncoderLayer`` (a test checks both the count and the matmul FLOPs against
it). The softmax, the scaling and the causal mask are not counted (O(s^2 h), under 1% at
these sizes); causal attention is counted over the full s x s square, as Megatron-LM and
Kaplan et al. (2020) do. Formulas rather than meta modules keep GPT-3's 96 x 8 layers
instant to build.

Around the blocks: token and position embeddings (plus the segment "type" embedding of
BERT, and its embedding LayerNorm); GPT ends with a final LayerNorm and an LM head whose
weights are tied to the token embedding (0 parameters, 2 s d V FLOPs); BERT ends with the
pooler (a d x d dense layer with tanh on the first token). BERT's pre-training heads (MLM,
next-sentence) are not part of the published counts and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dlcomm.workloads.catalog.base import Layer, ModelTable, register_model
from dlcomm.workloads.catalog.trace import NORM_FLOPS

__all__ = ["TransformerConfig", "transformer_layers", "block_layers", "CONFIGS"]


@dataclass(frozen=True)
class TransformerConfig:
    style: str          # "gpt" (pre-LN decoder, tied LM head) or "bert" (post-LN encoder)
    vocab: int          # token vocabulary
    seq: int            # tokens per sample (sequence length)
    d: int              # model width
    blocks: int         # transformer blocks
    heads: int          # attention heads (no effect on params or FLOPs)
    ffn: int            # feed-forward width
    positions: int      # rows of the learned position embedding
    types: int = 0      # segment ("token type") embedding rows (BERT: 2)


def _embedding(name: str, rows: int, dim: int, lookups: int, join: str | None = None) -> Layer:
    # an added position/type embedding costs one addition per output element
    flops = float(lookups * dim) if join else 0.0
    return Layer(name, "embedding", rows * dim, flops, lookups, lookups * dim, rows, dim, 1,
                 lookups, lookups, shortcut_from=join)


def _linear(name: str, d_in: int, d_out: int, rows: int, extra: float = 0.0,
            join: str | None = None, bias: bool = True) -> Layer:
    params = d_in * d_out + (d_out if bias else 0)
    return Layer(name, "linear", params, 2.0 * rows * d_in * d_out + extra, rows * d_in,
                 rows * d_out, d_in, d_out, 1, rows, rows, shortcut_from=join)


def _norm(name: str, d: int, rows: int) -> Layer:
    return Layer(name, "norm", 2 * d, float(NORM_FLOPS * rows * d), rows * d, rows * d, d, d,
                 1, rows, rows)


def _attention(name: str, d: int, s: int) -> Layer:
    return Layer(name, "attention", 0, 4.0 * s * s * d, 3 * s * d, s * d, 3 * d, d, 1, s, s)


def block_layers(cfg: TransformerConfig, prefix: str, block_input: str) -> list[Layer]:
    """The layers of one block; ``block_input`` names the layer whose output enters it."""
    s, d, f = cfg.seq, cfg.d, cfg.ffn
    if cfg.style == "gpt":   # x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
        return [
            _norm(f"{prefix}.ln_1", d, s),
            _linear(f"{prefix}.attn.qkv", d, 3 * d, s),
            _attention(f"{prefix}.attn.core", d, s),
            _linear(f"{prefix}.attn.proj", d, d, s, extra=s * d, join=block_input),
            _norm(f"{prefix}.ln_2", d, s),
            _linear(f"{prefix}.mlp.fc", d, f, s, extra=s * f),
            _linear(f"{prefix}.mlp.proj", f, d, s, extra=s * d, join=f"{prefix}.attn.proj"),
        ]
    # bert: x = LN(x + attn(x)); x = LN(x + ffn(x))
    return [
        _linear(f"{prefix}.attention.qkv", d, 3 * d, s),
        _attention(f"{prefix}.attention.core", d, s),
        _linear(f"{prefix}.attention.proj", d, d, s, extra=s * d, join=block_input),
        _norm(f"{prefix}.attention.norm", d, s),
        _linear(f"{prefix}.ffn.fc", d, f, s, extra=s * f),
        _linear(f"{prefix}.ffn.proj", f, d, s, extra=s * d, join=f"{prefix}.attention.norm"),
        _norm(f"{prefix}.ffn.norm", d, s),
    ]


def transformer_layers(cfg: TransformerConfig) -> tuple[Layer, ...]:
    """All layers of a GPT or BERT model in forward order, per sequence."""
    s, d = cfg.seq, cfg.d
    if cfg.style == "gpt":
        layers = [_embedding("wte", cfg.vocab, d, s),
                  _embedding("wpe", cfg.positions, d, s, join="wte")]
        last = "wpe"
        for i in range(cfg.blocks):
            layers += block_layers(cfg, f"h.{i}", last)
            last = f"h.{i}.mlp.proj"
        # the LM head is tied to wte: its weights are counted once, in the embedding
        layers += [_norm("ln_f", d, s),
                   replace(_linear("lm_head", d, cfg.vocab, s, bias=False), params=0)]
        return tuple(layers)
    layers = [_embedding("embeddings.word", cfg.vocab, d, s),
              _embedding("embeddings.position", cfg.positions, d, s, join="embeddings.word"),
              _embedding("embeddings.token_type", cfg.types, d, s,
                         join="embeddings.position"),
              _norm("embeddings.norm", d, s)]
    last = "embeddings.norm"
    for i in range(cfg.blocks):
        layers += block_layers(cfg, f"encoder.{i}", last)
        last = f"encoder.{i}.ffn.norm"
    layers.append(_linear("pooler", d, d, 1, extra=d))   # first token only, tanh
    return tuple(layers)


CONFIGS = {
    # Devlin et al. 2019 (BERT), Sec. 3: L=12, H=768, A=12 / L=24, H=1024, A=16; WordPiece
    # vocabulary 30,522 as released; 512 positions, 2 segments.
    "bert-base": TransformerConfig("bert", 30522, 512, 768, 12, 12, 3072, 512, 2),
    "bert-large": TransformerConfig("bert", 30522, 512, 1024, 24, 16, 4096, 512, 2),
    # Radford et al. 2019 (GPT-2), Table 2: 48 layers, d=1600; BPE vocabulary 50,257; n_ctx 1024
    "gpt2-1.5b": TransformerConfig("gpt", 50257, 1024, 1600, 48, 25, 6400, 1024),
    # Brown et al. 2020 (GPT-3), Table 2.1: 96 layers, d=12288, 96 heads of 128, n_ctx 2048
    "gpt3-175b": TransformerConfig("gpt", 50257, 2048, 12288, 96, 96, 4 * 12288, 2048),
}


def _table(name: str, published: float, source: str, batch: int) -> ModelTable:
    cfg = CONFIGS[name]
    return ModelTable(name, "transformer", transformer_layers(cfg),
                      f"sequence of {cfg.seq} tokens", published, source, batch)


@register_model("bert-base", "BERT-Base (110M), sequences of 512 tokens")
def bert_base() -> ModelTable:
    return _table("bert-base", 110e6, "Devlin et al., NAACL 2019, Sec. 3: BERT-BASE 110M", 32)


@register_model("bert-large", "BERT-Large (340M), sequences of 512 tokens")
def bert_large() -> ModelTable:
    return _table("bert-large", 340e6, "Devlin et al., NAACL 2019, Sec. 3: BERT-LARGE 340M",
                  8)


@register_model("gpt2-1.5b", "GPT-2 XL (1.5B), sequences of 1024 tokens")
def gpt2_xl() -> ModelTable:
    return _table("gpt2-1.5b", 1542e6,
                  "Radford et al. 2019, Table 2: 1542M (the released checkpoint has "
                  "1,557,611,200)", 8)


@register_model("gpt3-175b", "GPT-3 (175B), sequences of 2048 tokens")
def gpt3() -> ModelTable:
    return _table("gpt3-175b", 175.0e9, "Brown et al., NeurIPS 2020, Table 2.1: 175.0B", 1)
