"""Trainable workloads: a model, its data, its loss and how to score it.

A workload factory takes the run's seed plus its spec options and returns a
:class:`Workload`. Models are written here (nanoGPT style); data comes from packages
(scikit-learn's digits), from the Python standard library's own sources, or from
generators in this package; nothing is downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset

from dlcomm.registry import Registry, Spec, parse_spec

__all__ = ["Workload", "WORKLOADS", "make_workload", "EvalSums", "classify_sums",
           "finish_metrics"]

# (loss_sum, correct, count): summed over a shard of the test set, then all-reduced.
EvalSums = torch.Tensor


@dataclass
class Workload:
    """Everything the trainer needs to train and score one model."""

    name: str
    model: nn.Module
    train_set: Dataset
    test_set: Dataset
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # mean loss of a batch
    eval_sums: Callable[[torch.Tensor, torch.Tensor], EvalSums]  # (loss_sum, correct, count)
    metric: str  # "accuracy", "perplexity" or "loss": the headline number of the run
    batch_size: int  # per worker
    lr: float
    optimizer: str = "adam"  # "adam" or "sgd"
    default_epochs: int = 5
    facts: dict | None = None  # workload-specific facts for the result JSON

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def gradient_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters()
                   if p.requires_grad)


def classify_sums(logits: torch.Tensor, target: torch.Tensor) -> EvalSums:
    """Summed cross-entropy, correct predictions and count, for logits (N, C) or (B, T, C)."""
    flat = logits.reshape(-1, logits.shape[-1])
    tgt = target.reshape(-1)
    loss_sum = nn.functional.cross_entropy(flat, tgt, reduction="sum")
    correct = (flat.argmax(dim=-1) == tgt).sum()
    return torch.stack([loss_sum.detach().double(), correct.double(),
                        torch.tensor(float(tgt.numel()), dtype=torch.float64)])


def finish_metrics(metric: str, sums: EvalSums) -> dict[str, float]:
    """Turn all-reduced :data:`EvalSums` into the metrics of the result JSON."""
    loss_sum, correct, count = (float(v) for v in sums)
    loss = loss_sum / max(count, 1.0)
    out = {"loss": loss}
    if metric == "accuracy":
        out["accuracy"] = correct / max(count, 1.0)
    elif metric == "perplexity":
        out["perplexity"] = math.exp(min(loss, 700.0))
        out["accuracy"] = correct / max(count, 1.0)
    return out


WORKLOADS: Registry[Workload] = Registry("workload")


def make_workload(spec: str | Spec, seed: int = 0) -> Workload:
    """Build the workload named by ``spec``; the same seed gives the same model and data."""
    parsed = spec if isinstance(spec, Spec) else parse_spec(spec)
    factory = WORKLOADS.get(parsed.name)
    return factory(seed=seed, **parsed.options)
