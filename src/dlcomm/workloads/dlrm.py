"""``dlrm-synthetic``: a small DLRM-style recommender on generated click data.

Model (after Naumov et al., DLRM 2019): a bottom MLP over dense features, one embedding table
per categorical feature, pairwise dot products between all of them (the interaction), and a
top MLP to a click logit.

Data: ``examples`` click records, generated here. Each of the ``tables`` categorical
features draws its id from a power law (Zipf exponent ``alpha``: a few items are very popular,
most are rare), the dense features are standard normal, and the label is drawn from a
hidden teacher model (per-row weights for every table plus a linear term on the dense
features), so the task is learnable and the best possible accuracy is below 100%. A step
touches only the rows its batch's ids name: the embedding gradient is mostly zero rows.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from dlcomm.registry import parse_size, reject_unknown, take_option
from dlcomm.workloads.base import WORKLOADS, Workload, classify_sums

__all__ = ["DLRM", "click_data"]


class DLRM(nn.Module):
    def __init__(self, dense: int, tables: int, rows: int, dim: int) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.tables = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 64), nn.ReLU(), nn.Linear(64, 2))
        self._pairs = torch.triu_indices(tables + 1, tables + 1, offset=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense, ids = x[:, : -len(self.tables)], x[:, -len(self.tables):].long()
        z = self.bottom(dense)                                             # (B, d)
        feats = torch.stack([z] + [t(ids[:, i]) for i, t in enumerate(self.tables)], 1)
        inter = feats @ feats.transpose(1, 2)                              # (B, T+1, T+1)
        pairs = inter[:, self._pairs[0], self._pairs[1]]                   # (B, pairs)
        return self.top(torch.cat([z, pairs], dim=1))                      # (B, 2)


def click_data(examples: int, dense: int, tables: int, rows: int, alpha: float,
               seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, labels): dense features then the categorical ids as floats."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, rows + 1, dtype=torch.float64)
    popularity = ranks ** -alpha
    perm = [torch.randperm(rows, generator=gen) for _ in range(tables)]  # popular != low ids
    ids = torch.stack([perm[t][torch.multinomial(popularity, examples, replacement=True,
                                                 generator=gen)] for t in range(tables)], 1)
    x_dense = torch.randn(examples, dense, generator=gen)
    row_weight = torch.randn(tables, rows, generator=gen)
    w_dense = torch.randn(dense, generator=gen) / dense ** 0.5
    logit = sum(row_weight[t][ids[:, t]] for t in range(tables)) / tables ** 0.5 \
        + x_dense @ w_dense
    labels = (torch.rand(examples, generator=gen) < torch.sigmoid(2 * logit)).long()
    return torch.cat([x_dense, ids.float()], dim=1), labels


@WORKLOADS.register("dlrm-synthetic", "DLRM-style recommender, power-law click data, accuracy")
def make_dlrm(seed: int = 0, **options: str) -> Workload:
    name = "dlrm-synthetic"
    owner = f"workload {name!r}"
    tables = take_option(options, "tables", int, 8, owner)
    rows = take_option(options, "rows", parse_size, 20_000, owner)
    dim = take_option(options, "dim", int, 16, owner)
    examples = take_option(options, "examples", parse_size, 40_000, owner)
    alpha = take_option(options, "alpha", float, 1.1, owner)
    dense = take_option(options, "dense", int, 13, owner)
    reject_unknown(options, owner)
    x, y = click_data(examples + examples // 5, dense, tables, rows, alpha, seed=1234)
    cut = examples
    torch.manual_seed(seed)
    return Workload(name=name, model=DLRM(dense, tables, rows, dim),
                    train_set=TensorDataset(x[:cut], y[:cut]),
                    test_set=TensorDataset(x[cut:], y[cut:]), loss=nn.functional.cross_entropy,
                    eval_sums=classify_sums, metric="accuracy", batch_size=64, lr=3e-3,
                    default_epochs=1,
                    facts={"tables": tables, "rows": rows, "dim": dim, "alpha": alpha,
                           "train_examples": cut, "test_examples": len(y) - cut})
