"""Small networks for the simulator's tests."""

from __future__ import annotations

import numpy as np
import pytest

from dlcomm.plan.simulate.collective import Collectives, ExchangeModel
from dlcomm.plan.simulate.fluid import SimNetwork
from dlcomm.plan.topology import build_topology
from dlcomm.plan.traffic import Parallelism

RATE_GBPS = 8.0               # 1e9 bytes/s per link direction: times read as bytes / 1e9
RATE_BPS = RATE_GBPS * 1e9 / 8


def star(n: int, ina: bool = True) -> SimNetwork:
    """n accelerators on one switch, one port of RATE_GBPS each."""
    spec = f"fattree:n={n},ports=1,rate={RATE_GBPS:g}" + (",ina=1" if ina else "")
    return SimNetwork(build_topology(spec), np.arange(n))


def dp_collectives(net: SimNetwork, n: int, algorithm: str = "ring", alpha: float = 0.0,
                   exchange: ExchangeModel | None = None) -> Collectives:
    return Collectives(net, Parallelism(dp=n, bytes=4), exchange or ExchangeModel(),
                       algorithm, alpha, 0.0)


@pytest.fixture
def star8() -> SimNetwork:
    return star(8)
