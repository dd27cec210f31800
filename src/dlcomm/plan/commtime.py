"""Communication time of one training iteration on a topology, with a placement.

1. Ranks form a grid DP x PP x TP (TP fastest, then PP, then DP; EP groups are runs of
   ``ep`` consecutive DP replicas). ``linear`` placement puts rank r on accelerator r of
   the topology's natural order (a board, a leaf, a torus row first), so TP groups sit
   on neighbouring accelerators; ``random`` scatters them (seeded): placement matters on
   meshes and tori, hardly on a non-blocking fat tree.
2. For every collective of ``dlcomm.plan.traffic``, all groups of its dimension run at
   once. The flow model gives the rate every flow of the algorithm's pattern sustains
   concurrently (``concurrent`` rate, ECMP routing), which sets beta:
   - all-reduce: the fastest of a bidirectional ring over the group (beta = 1/(2 rate)),
     a 2D torus of rings over the group seen as g1 x g2 (4 flows per rank, beta/4), and,
     for groups of at most 64 (a power of two), Rabenseifner with each round's own rate;
     in-network aggregation on fat trees with ``ina=1`` (T ~ n / injection);
   - all-to-all: all pairs of each group at once, pairwise-exchange time; above
     ``SAMPLE_FLOWS`` flows the link loads are estimated from k random partner offsets
     (rank i sends to member i+o of its group; fixed seed), scaled by (g-1)/k, so every
     rank's own links stay exact and only shared links are estimated; a whole-machine
     all-to-all uses the exact symmetric computation;
   - point-to-point: every stage boundary of every pipeline sends at once.
3. The iteration's communication time is the sum over collectives of calls x time,
   with no overlap with computation or between dimensions (an upper bound on exposed
   communication).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.plan import collectives as coll
from dlcomm.plan.bandwidth import alltoall_gbps
from dlcomm.plan.flownet import FlowNet
from dlcomm.plan.flows import route_matrix
from dlcomm.plan.topology.base import Topology
from dlcomm.plan.topology.fattree import FatTree
from dlcomm.plan.traffic import Comm, Parallelism

__all__ = ["PLACEMENTS", "place_ranks", "group_ranks", "CommTime", "comm_times",
           "SAMPLE_FLOWS"]

PLACEMENTS = ("linear", "random")
SAMPLE_FLOWS = 500_000


def place_ranks(par: Parallelism, accelerators: int, placement: str = "linear",
                seed: int = 0) -> np.ndarray:
    """Accelerator of every rank (index = rank)."""
    if par.world > accelerators:
        raise ConfigError(f"parallelism needs {par.world} accelerators, the topology has "
                          f"{accelerators}")
    if placement == "linear":
        return np.arange(par.world)
    if placement == "random":
        return np.random.default_rng(seed).permutation(accelerators)[:par.world]
    raise ConfigError(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")


def group_ranks(par: Parallelism, dim: str) -> np.ndarray:
    """(groups, group size) array of the ranks that communicate together in ``dim``."""
    idx = np.arange(par.world).reshape(par.dp, par.pp, par.tp)
    if dim == "tp":
        return idx.reshape(-1, par.tp)
    if dim == "pp":
        return idx.transpose(0, 2, 1).reshape(-1, par.pp)
    if dim in ("dp", "embedding"):
        return idx.transpose(1, 2, 0).reshape(-1, par.dp)
    experts = idx.reshape(par.dp // par.ep, par.ep, par.pp, par.tp)
    if dim == "ep":
        return experts.transpose(0, 2, 3, 1).reshape(-1, par.ep)
    if dim == "dp-expert":
        return experts.transpose(1, 2, 3, 0).reshape(-1, par.dp // par.ep)
    raise ValueError(f"unknown dimension {dim!r}")


@dataclass(frozen=True)
class CommTime:
    dim: str
    op: str
    group: int
    nbytes: float
    calls: int
    algorithm: str
    seconds_per_call: float

    @property
    def seconds(self) -> float:
        return self.calls * self.seconds_per_call

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": self.seconds}


def _rate(net: FlowNet, src: np.ndarray, dst: np.ndarray, scale: float = 1.0) -> float:
    """Concurrent rate of the flows (bytes/s per flow); ``scale`` multiplies the loads
    (for a sample of flows)."""
    load = route_matrix(net, src, dst) @ np.ones(len(src)) * scale
    used = load > 0
    if not used.any():
        return math.inf
    return float((net.cap[used] / load[used]).min()) * 1e9 / 8


def _allreduce(net: FlowNet, topo: Topology, groups: np.ndarray, n: float,
               alpha: float) -> tuple[str, float]:
    g = groups.shape[1]
    flat = groups.ravel()
    options = []
    ring = _rate(net, np.concatenate([flat, flat]),
                 np.concatenate([np.roll(groups, -1, 1).ravel(), np.roll(groups, 1, 1).ravel()]))
    options.append(("ring", coll.ring_allreduce(g, n, alpha, 1 / (2 * ring))))
    g1 = max(d for d in range(1, int(math.isqrt(g)) + 1) if g % d == 0)
    if g1 >= 2:
        grid = groups.reshape(len(groups), g // g1, g1)
        nbrs = [np.roll(grid, s, axis) for axis in (1, 2) for s in (-1, 1)]
        rate = _rate(net, np.tile(flat, 4), np.concatenate([b.ravel() for b in nbrs]))
        options.append(("torus-rings", coll.torus_allreduce([g1, g // g1], n, alpha,
                                                            1 / rate, rings=4)))
    if g & (g - 1) == 0 and 2 <= g <= 64:
        members = np.arange(g)
        betas = [1 / _rate(net, flat, groups[:, members ^ (1 << s)].ravel())
                 for s in range(coll.log2_steps(g))]
        options.append(("rabenseifner", coll.rabenseifner_steps(g, n, alpha, betas)))
    if isinstance(topo, FatTree) and topo.ina:
        inj = topo.injection_gbps * 1e9 / 8
        options.append(("ina", coll.ina_allreduce(n, alpha, 1 / inj, topo.clos.levels)))
    return min(options, key=lambda o: o[1])


def _alltoall(net: FlowNet, groups: np.ndarray, n: float, alpha: float,
              seed: int) -> tuple[str, float]:
    count, g = groups.shape
    if count == 1 and g == net.n_acc:
        rate = alltoall_gbps(net) / (g - 1) * 1e9 / 8
        return "pairwise (exact, symmetric)", coll.alltoall_pairwise(g, n, alpha,
                                                                     1 / ((g - 1) * rate))
    pairs = count * g * (g - 1)
    if pairs <= SAMPLE_FLOWS:
        i, j = np.nonzero(~np.eye(g, dtype=bool))
        src = groups[:, i].ravel()
        dst = groups[:, j].ravel()
        rate, how = _rate(net, src, dst), "pairwise"
    else:
        # sample partner offsets, not flows: every rank still sends and receives the
        # same number of flows, so its own links' loads stay exact after scaling
        k = max(1, SAMPLE_FLOWS // (count * g))
        offsets = np.random.default_rng(seed).choice(np.arange(1, g), k, replace=False)
        members = np.arange(g)
        src = np.concatenate([groups[:, members].ravel() for _ in offsets])
        dst = np.concatenate([groups[:, (members + o) % g].ravel() for o in offsets])
        rate = _rate(net, src, dst, (g - 1) / k)
        how = f"pairwise (sampled {k} of {g - 1} partner offsets)"
    return how, coll.alltoall_pairwise(g, n, alpha, 1 / ((g - 1) * rate))


def _p2p(net: FlowNet, groups: np.ndarray, n: float, alpha: float) -> tuple[str, float]:
    rate = _rate(net, groups[:, :-1].ravel(), groups[:, 1:].ravel())
    return "p2p", coll.p2p(n, alpha, 1 / rate)


def comm_times(topo: Topology, net: FlowNet, comms: list[Comm], par: Parallelism,
               placement: str = "linear", alpha: float = 1e-6,
               seed: int = 0) -> list[CommTime]:
    """Time of every collective of one iteration (module docstring)."""
    where = place_ranks(par, topo.accelerators, placement, seed)
    out = []
    for comm in comms:
        groups = net.node_ids(where[group_ranks(par, comm.dim)].ravel().tolist()) \
            .reshape(-1, comm.group)
        if comm.op == "allreduce":
            how, t = _allreduce(net, topo, groups, comm.nbytes, alpha)
        elif comm.op == "alltoall":
            how, t = _alltoall(net, groups, comm.nbytes, alpha, seed)
        else:
            how, t = _p2p(net, groups, comm.nbytes, alpha)
        out.append(CommTime(comm.dim, comm.op, comm.group, comm.nbytes, comm.calls, how, t))
    return out
