"""A measured job's profile: the gradients' block density, its own and the workers' union."""

import pytest
import torch
from torch import nn

from dlcomm.advise.profile import DENSITY_BLOCK, measure_profile


class Rows(nn.Module):
    """An embedding whose rows are one density block each: a batch of row indices touches
    exactly those blocks of the gradient."""

    def __init__(self, rows: int = 64) -> None:
        super().__init__()
        self.table = nn.Embedding(rows, DENSITY_BLOCK)

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.table(index)


def test_the_union_density_counts_every_workers_blocks():
    torch.manual_seed(0)
    model = Rows(64)
    batches = [torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([10]),
               torch.tensor([63])]
    losses = [lambda b=b: model(b).square().mean() for b in batches]
    profile = measure_profile("rows", model, (batches[0],), steps=1, warmup=0,
                              workers_losses=losses)
    assert profile.density == pytest.approx(2 / 64)        # this worker's rows 0 and 1
    assert profile.result_density == pytest.approx(5 / 64)  # 0, 1, 2, 10, 63
    alone = measure_profile("rows", model, (batches[0],), steps=1, warmup=0)
    assert alone.union_density is None and alone.result_density == alone.density
