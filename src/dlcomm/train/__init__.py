"""Training: the worker runtime, the trainer loop, the local launcher and their results."""

from dlcomm.train.config import TrainConfig

__all__ = ["TrainConfig"]
