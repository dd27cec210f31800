"""``stdlib-lm``: a small transformer language model on the Python standard library's source.

The corpus is the ``.py`` files of the running interpreter's standard library (present on
every machine; test suites and site-packages excluded), tokenized into words, numbers and
punctuation. Files are split into train and held-out by a hash of their path, so the
held-out perplexity measures generalisation to unseen files. The vocabulary holds the most
frequent training tokens (>= 10,000) plus ``<unk>``; because a batch touches only a few
hundred of them, the embedding gradient of a step is mostly zero rows, the sparsity that
sparse aggregation exploits. The embedding is deliberately not tied to the output layer.
"""

from __future__ import annotations

import hashlib
import os
import re
import sysconfig
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from dlcomm.errors import ConfigError
from dlcomm.registry import parse_size, reject_unknown, take_option
from dlcomm.workloads.base import WORKLOADS, Workload, classify_sums

__all__ = ["Corpus", "build_corpus", "tokenize", "TransformerLM", "LMConfig"]

TOKEN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[^\sA-Za-z0-9_]")
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                           "__pycache__"})
UNK = "<unk>"


def tokenize(text: str) -> list[str]:
    """Words (identifiers), numbers and single punctuation characters, in order."""
    return TOKEN_RE.findall(text)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path) -> list[Path]:
    """The standard library's ``.py`` files in a stable order, without tests."""
    files = [p for p in root.rglob("*.py")
             if not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(relpath: str) -> bool:
    """One file in ten, chosen by a hash of its path, is held out."""
    return zlib.crc32(relpath.encode()) % 10 == 0


@dataclass
class Corpus:
    vocab: list[str]        # id -> token; id 0 is <unk>
    train: torch.Tensor     # (N_train,) int64 token ids
    test: torch.Tensor      # (N_test,) int64 token ids
    files: int              # files read
    digest: str             # identifies the corpus (same on machines with the same stdlib)


def build_corpus(vocab_size: int, max_train_tokens: int, max_test_tokens: int,
                 root: Path | None = None) -> Corpus:
    """Read, tokenize, split and encode the corpus (pure apart from reading files)."""
    root = root or stdlib_root()
    train_tokens: list[str] = []
    test_tokens: list[str] = []
    digest = hashlib.sha256()
    files = 0
    for path in corpus_files(root):
        rel = path.relative_to(root).as_posix()
        bucket, limit = ((test_tokens, max_test_tokens) if is_heldout(rel)
                         else (train_tokens, max_train_tokens))
        if len(bucket) >= limit:
            if len(train_tokens) >= max_train_tokens and len(test_tokens) >= max_test_tokens:
                break
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        files += 1
        digest.update(rel.encode())
        bucket.extend(tokenize(text)[: limit - len(bucket)])
    counts = Counter(train_tokens)
    if len(counts) < vocab_size - 1:
        raise ConfigError(f"stdlib-lm: the corpus at {root} has only {len(counts)} distinct "
                          f"tokens, fewer than vocab={vocab_size}")
    vocab = [UNK] + [tok for tok, _ in counts.most_common(vocab_size - 1)]
    index = {tok: i for i, tok in enumerate(vocab)}
    encode = lambda toks: torch.tensor([index.get(t, 0) for t in toks], dtype=torch.long)  # noqa: E731
    digest.update(f"{vocab_size}/{max_train_tokens}/{max_test_tokens}".encode())
    return Corpus(vocab, encode(train_tokens), encode(test_tokens), files,
                  digest.hexdigest()[:16])


def cached_corpus(vocab_size: int, max_train_tokens: int, max_test_tokens: int) -> Corpus:
    """:func:`build_corpus`, cached under ``$XDG_CACHE_HOME/dlcomm`` (written atomically)."""
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dlcomm"
    key = f"{stdlib_root()}|{vocab_size}|{max_train_tokens}|{max_test_tokens}|v1"
    path = cache_dir / f"stdlib-lm-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    try:
        blob = torch.load(path, weights_only=True)
        return Corpus(blob["vocab"], blob["train"], blob["test"], blob["files"], blob["digest"])
    except (OSError, KeyError, RuntimeError, EOFError):
        pass
    corpus = build_corpus(vocab_size, max_train_tokens, max_test_tokens)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"vocab": corpus.vocab, "train": corpus.train, "test": corpus.test,
                    "files": corpus.files, "digest": corpus.digest}, tmp)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs the rebuild next time
    return corpus


@dataclass(frozen=True)
class LMConfig:
    vocab: int = 12_000   # tokens in the vocabulary, <unk> included
    context: int = 32     # tokens per training window
    dim: int = 64         # model width
    layers: int = 2       # transformer blocks
    heads: int = 4        # attention heads per block


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x MLP, both residual."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(),
                                 nn.Linear(4 * cfg.dim, cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)                      # 3 x (B, T, d)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in (q, k, v))                                       # (B, nh, T, hs)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))                # (B, T, d)
        return x + self.mlp(self.ln2(x))


class TransformerLM(nn.Module):
    """Token + position embeddings, ``layers`` blocks, untied output projection."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.context, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))  # (B, T, d)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))                               # (B, T, V)


def windows(ids: torch.Tensor, context: int) -> TensorDataset:
    """Non-overlapping windows: inputs ids[i:i+T], targets ids[i+1:i+T+1]."""
    n = (len(ids) - 1) // context
    x = ids[: n * context].view(n, context)
    y = ids[1: n * context + 1].view(n, context)
    return TensorDataset(x, y)


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


@WORKLOADS.register("stdlib-lm", "transformer LM on the Python stdlib's source, perplexity")
def make_stdlib_lm(seed: int = 0, **options: str) -> Workload:
    name = "stdlib-lm"
    owner = f"workload {name!r}"
    cfg = LMConfig(vocab=take_option(options, "vocab", int, 12_000, owner),
                   context=take_option(options, "context", int, 32, owner),
                   dim=take_option(options, "dim", int, 64, owner),
                   layers=take_option(options, "layers", int, 2, owner),
                   heads=take_option(options, "heads", int, 4, owner))
    train_tokens = take_option(options, "tokens", parse_size, 1_500_000, owner)
    test_tokens = take_option(options, "test_tokens", parse_size, 32_768, owner)
    reject_unknown(options, owner)
    if cfg.vocab < 10_000:
        raise ConfigError(f"workload {name!r}: vocab must be >= 10000, got {cfg.vocab}")
    if cfg.dim % cfg.heads:
        raise ConfigError(f"workload {name!r}: dim {cfg.dim} is not divisible by heads {cfg.heads}")
    corpus = cached_corpus(cfg.vocab, train_tokens, test_tokens)
    torch.manual_seed(seed)
    return Workload(name=name, model=TransformerLM(cfg),
                    train_set=windows(corpus.train, cfg.context),
                    test_set=windows(corpus.test, cfg.context), loss=_lm_loss,
                    eval_sums=classify_sums, metric="perplexity", batch_size=16, lr=3e-3,
                    default_epochs=1,
                    facts={"vocab": cfg.vocab, "context": cfg.context, "dim": cfg.dim,
                           "layers": cfg.layers, "train_tokens": len(corpus.train),
                           "test_tokens": len(corpus.test), "files": corpus.files,
                           "corpus_digest": corpus.digest})
