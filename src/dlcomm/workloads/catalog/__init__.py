"""Layer tables of big models, shared by emulation, topology planning, AccPar and simulation.

    from dlcomm.workloads.catalog import get_model, iteration_time, gradient_buckets
    table = get_model("resnet50")          # ModelTable, built once and cached
    timing = iteration_time(table, get_accelerator("a100"), batch=256)

Names: alexnet, vgg16, vgg19, resnet18/34/50/101/152, bert-base, bert-large, gpt2-1.5b,
gpt3-175b, dlrm, ncf, lstm-lm (``MODELS.names()``). How each table is derived: docs/workloads.md.
"""

from dlcomm.workloads.catalog import cnn as _cnn  # noqa: F401  (registers the CNNs)
from dlcomm.workloads.catalog import recommender as _recommender  # noqa: F401
from dlcomm.workloads.catalog import rnn as _rnn  # noqa: F401
from dlcomm.workloads.catalog import transformer as _transformer  # noqa: F401
from dlcomm.workloads.catalog.base import MODELS, Layer, ModelTable, get_model
from dlcomm.workloads.catalog.compute import (
                                              BACKWARD_FACTOR,
                                              Bucket,
                                              IterationTime,
                                              gradient_buckets,
                                              iteration_time,
                                              model_buckets,
)

__all__ = ["MODELS", "Layer", "ModelTable", "get_model", "IterationTime", "Bucket",
           "iteration_time", "gradient_buckets", "model_buckets", "BACKWARD_FACTOR"]
