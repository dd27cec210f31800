"""``synthetic``: parameter tensors of any size and count, for benchmarks.

``synthetic:tensors=4,numel=25M`` builds 4 parameter tensors of 25 million float32 each.
The loss pulls every parameter towards a random target per example, so every gradient is
dense and non-zero, and the forward/backward cost is one pass over the parameters.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from dlcomm.errors import ConfigError
from dlcomm.registry import parse_size, reject_unknown, take_option
from dlcomm.workloads.base import WORKLOADS, Workload

__all__ = ["SyntheticModel"]


class SyntheticModel(nn.Module):
    """``tensors`` parameters of ``numel`` elements; output = per-example loss terms."""

    def __init__(self, tensors: int, numel: int) -> None:
        super().__init__()
        self.params = nn.ParameterList(nn.Parameter(torch.randn(numel) * 0.01)
                                       for _ in range(tensors))

    def forward(self, target: torch.Tensor) -> torch.Tensor:
        # target: (B, 1) -> loss per example (B,)
        return sum(((p.unsqueeze(0) - target) ** 2).mean(dim=1) for p in self.params)


def _mean_output(output: torch.Tensor, _target: torch.Tensor) -> torch.Tensor:
    return output.mean()


def _eval_sums(output: torch.Tensor, _target: torch.Tensor) -> torch.Tensor:
    return torch.tensor([float(output.sum()), 0.0, float(output.numel())], dtype=torch.float64)


@WORKLOADS.register("synthetic", "parameter tensors of any size/count (tensors=, numel=)")
def make_synthetic(seed: int = 0, **options: str) -> Workload:
    tensors = take_option(options, "tensors", int, 4, "workload 'synthetic'")
    numel = take_option(options, "numel", parse_size, 1_000_000, "workload 'synthetic'")
    examples = take_option(options, "examples", int, 4096, "workload 'synthetic'")
    reject_unknown(options, "workload 'synthetic'")
    if tensors < 1 or numel < 1:
        raise ConfigError("workload 'synthetic' needs tensors >= 1 and numel >= 1")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    targets = torch.randn(examples, 1, generator=gen)
    data = TensorDataset(targets, targets)
    return Workload(name="synthetic", model=SyntheticModel(tensors, numel), train_set=data,
                    test_set=TensorDataset(targets[:256], targets[:256]), loss=_mean_output,
                    eval_sums=_eval_sums, metric="loss", batch_size=32, lr=1e-2,
                    optimizer="sgd", default_epochs=1,
                    facts={"tensors": tensors, "numel": numel})
