"""The simulator's side of calibration: the modelled all-reduce and the fit of measured times.

Calibration (``dlcomm simulate calibrate``, :mod:`dlcomm.bench.calibrate`) measures real
exchanges on the emulated star; what the simulator needs of it is pure and lives here:
the flow model's time of one all-reduce on that star (:func:`modelled_allreduce_s`) and
the fit ``measured(S) = overhead + efficiency x modelled(S)`` (:func:`fit`, least squares
on relative residuals, overhead >= 0), whose two constants scale the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dlcomm.plan.simulate.collective import Collectives, ExchangeModel
from dlcomm.plan.simulate.fluid import SimNetwork
from dlcomm.plan.topology import build_topology
from dlcomm.plan.traffic import Parallelism

__all__ = ["star_spec", "modelled_allreduce_s", "fit"]


def star_spec(workers: int, link_bps: float) -> str:
    """The planner's one-switch fat tree: a star of ``workers`` links of ``link_bps``
    with an aggregating switch (the emulated star of ``dlcomm emulate``)."""
    return f"fattree:n={workers},ports=1,rate={link_bps / 1e9:.9g},ina=1"


def modelled_allreduce_s(kind: str, workers: int, nbytes: float, link_bps: float) -> float:
    """The flow model's time of one all-reduce of ``nbytes`` through ``kind`` on the star,
    with no latency (what calibration scales)."""
    topo = build_topology(star_spec(workers, link_bps))
    net = SimNetwork(topo, np.arange(workers))
    coll = Collectives(net, Parallelism(dp=workers, bytes=4), ExchangeModel(kind),
                       "ring", 0.0, 0.0)
    return coll.gradients("dp", 0, nbytes).alone_s(net)


def fit(modelled: Sequence[float], measured: Sequence[float]) -> tuple[float, float]:
    """(overhead, efficiency) of measured = overhead + efficiency x modelled, overhead >= 0,
    minimising the squared relative residuals (residual / measured)."""
    x, y = np.asarray(modelled, float), np.asarray(measured, float)
    w = 1.0 / y
    design = np.column_stack([w, x * w])
    (a, c), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    if a < 0:
        xr = x * w
        a, c = 0.0, float(xr.sum() / (xr @ xr))
    return float(a), float(c)
