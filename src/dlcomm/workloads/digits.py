"""``digits-cnn``: scikit-learn's bundled handwritten digits and a small CNN.

1,797 real 8x8 grey-level images of the digits 0-9 (UCI optical recognition data, shipped
inside scikit-learn), split 80/20 stratified with a fixed seed: 1,437 train, 360 test.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from dlcomm.registry import reject_unknown, take_option
from dlcomm.workloads.base import WORKLOADS, Workload, classify_sums

__all__ = ["DigitsCNN", "load_digits_split"]


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, a 2x2 max-pool and two fully connected layers (~151k params)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))                   # (B, w, 8, 8)
        x = torch.relu(self.conv2(x))                   # (B, 2w, 8, 8)
        x = nn.functional.max_pool2d(x, 2).flatten(1)   # (B, 2w*16)
        return self.fc2(torch.relu(self.fc1(x)))        # (B, 10)


def load_digits_split(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """The digits data as (train, test) tensors, pixel values scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)  # (N, 1, 8, 8)
    y = torch.tensor(data.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(torch.arange(len(y)).numpy(), test_size=0.2,
                                           stratify=y.numpy(), random_state=seed)
    return (TensorDataset(x[idx_train], y[idx_train]), TensorDataset(x[idx_test], y[idx_test]))


@WORKLOADS.register("digits-cnn", "scikit-learn digits (real data), small CNN, accuracy")
def make_digits_cnn(seed: int = 0, **options: str) -> Workload:
    width = take_option(options, "width", int, 32, "workload 'digits-cnn'")
    reject_unknown(options, "workload 'digits-cnn'")
    train, test = load_digits_split(0)  # the split is fixed; the seed drives init and order
    torch.manual_seed(seed)
    return Workload(name="digits-cnn", model=DigitsCNN(width), train_set=train, test_set=test,
                    loss=nn.functional.cross_entropy, eval_sums=classify_sums,
                    metric="accuracy", batch_size=8, lr=3e-3, default_epochs=5,
                    facts={"train_examples": len(train), "test_examples": len(test)})
