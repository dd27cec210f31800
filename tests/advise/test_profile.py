"""A measured job's profile: the gradients' block density, its own and the workers' union;
the profile fitted to the trainer's measured step."""

import pytest
import torch
from torch import nn

from dlcomm.advise.profile import DENSITY_BLOCK, JobProfile, fitted_to_step, measure_profile
from dlcomm.workloads.catalog.compute import Bucket


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


def _profile() -> JobProfile:
    return JobProfile("p", forward_s=0.02, backward_s=0.05, optimizer_s=0.01,
                      buckets=(Bucket(0, ("b",), 250, 1000, 0.04),
                               Bucket(1, ("a",), 500, 2000, 0.05)))


def test_a_longer_trainer_step_is_the_trainers_overhead():
    fitted = fitted_to_step(_profile(), 0.1)
    assert fitted.overhead_s == pytest.approx(0.02)
    assert (fitted.forward_s, fitted.backward_s) == (0.02, 0.05)
    assert fitted.compute_s == pytest.approx(0.1)


def test_a_shorter_trainer_step_scales_the_profile_down_to_it():
    fitted = fitted_to_step(_profile(), 0.06)   # the profile's compute is 0.08
    assert fitted.overhead_s == 0.0
    assert fitted.compute_s == pytest.approx(0.06)
    assert fitted.forward_s == pytest.approx(0.015)
    assert [b.ready_s for b in fitted.buckets] == pytest.approx([0.03, 0.0375])
    assert [b.bytes for b in fitted.buckets] == [1000, 2000]
