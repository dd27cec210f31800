"""A user's own model for `dlcomm advise --model tests.advise.user_model:make`."""

import torch
from torch import nn


def make():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    return model, torch.randn(32, 64)


def not_a_model():
    return 42


def broken():
    raise ValueError("no data here")
