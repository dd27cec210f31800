"""Flow phases of a trace's communications on the planner topology (step 2 of
:mod:`dlcomm.plan.simulate.chakra_exec`).

A collective of a Chakra trace names its group of ranks (``pg_name``), not a dimension
of a DP x PP x TP grid, so its phases are built per group, with the simulator's
algorithms and latencies (:mod:`dlcomm.plan.simulate.collective`):

1. ALL_REDUCE: the algorithm asked; by default (``trace``) the one the trace records
   (dlcomm's ``dlcomm_algorithm``) where it applies to the group, else (and with
   ``best``) the fastest host algorithm with the network to itself; ``torus`` on the grid
   the group's accelerators form on a torus or mesh.
2. ALL_GATHER and REDUCE_SCATTER: the bidirectional ring of ``comm_size`` / g per member
   (``comm_size`` is the whole vector: the all-gather's output, the reduce-scatter's input;
   both move (g-1)/g of it per rank). ALL_TO_ALL: pairwise, comm_size per member.
3. A send: one flow from its rank to the destination's accelerator.

Every phase pays steps x (alpha + hops x hop latency), hops its longest route.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from dlcomm.plan.simulate.algorithms import (
    allgather_phases,
    allreduce_phases,
    alltoall_phases,
)
from dlcomm.plan.simulate.collective import Step, host_candidates
from dlcomm.plan.simulate.fluid import SimNetwork

__all__ = ["GroupCalls"]


class GroupCalls:
    """Flow phases of collectives on given groups of ranks and of sends (module docstring),
    cached; ``algorithm``: trace | best | an all-reduce algorithm."""

    def __init__(self, net: SimNetwork, algorithm: str = "trace", alpha_s: float = 1e-6,
                 hop_latency_s: float = 0.0) -> None:
        self.net, self.algorithm = net, algorithm
        self.alpha, self.hop = alpha_s, hop_latency_s
        self.cache: dict[Hashable, tuple[Step, ...]] = {}

    def _steps(self, gid: str, members: np.ndarray, phases: list[Any],
               nbytes: float) -> tuple[Step, ...]:
        out = []
        for ph in phases:
            pattern = self.net.phase(("chakra", gid), members[None, :], ph)
            out.append(Step(pattern.key, ph.fraction * nbytes,
                            ph.steps * (self.alpha + pattern.hops * self.hop)))
        return tuple(out)

    def _layout(self, members: np.ndarray) -> np.ndarray | None:
        """The members as the grid their accelerators form on a torus or mesh, or None."""
        coords = self.net.grid_coords()
        if coords is None:
            return None
        at = coords[self.net.node[members]]
        values = [np.unique(at[:, ax]) for ax in range(at.shape[1])]
        shape = tuple(len(v) for v in values)
        if int(np.prod(shape)) != len(members) or sum(n > 1 for n in shape) < 2:
            return None
        grid = np.full(shape, -1)
        grid[tuple(np.searchsorted(values[ax], at[:, ax]) for ax in range(at.shape[1]))] = \
            np.arange(len(members))
        return grid if (grid >= 0).all() else None

    def _allreduce(self, gid: str, members: np.ndarray, nbytes: float,
                   hint: str | None) -> tuple[Step, ...]:
        g, layout = len(members), self._layout(members)
        if g < 2:
            return ()
        names = host_candidates(g, layout is not None)
        if self.algorithm not in ("trace", "best"):
            names = [self.algorithm]
        elif self.algorithm == "trace" and hint in names:
            names = [hint]
        options = [self._steps(gid, members, allreduce_phases(
            n, g, layout if n == "torus" else None), nbytes) for n in names]
        return min(options, key=lambda steps: sum(
            s.latency_s + s.nbytes / self.net.patterns[s.pattern].rate_Bps for s in steps))

    def collective(self, gid: str, ranks: Sequence[int], comm: str, nbytes: float,
                   hint: str | None) -> tuple[Step, ...]:
        """The steps of collective ``comm`` of ``nbytes`` on group ``gid`` of ``ranks``."""
        key = (gid, comm, nbytes, hint)
        if key not in self.cache:
            members, g = np.asarray(ranks), len(ranks)
            self.cache[key] = (
                self._allreduce(gid, members, nbytes, hint) if comm == "ALL_REDUCE" else
                self._steps(gid, members, alltoall_phases(g), nbytes) if comm == "ALL_TO_ALL"
                else self._steps(gid, members, allgather_phases(g), nbytes / g))
        return self.cache[key]

    def p2p(self, src: int, dst: int, nbytes: float) -> tuple[Step, ...]:
        key = ("p2p", src, dst)
        pattern = self.net.flows(key, np.array([src]), np.array([dst]))
        return (Step(key, nbytes, self.alpha + pattern.hops * self.hop),)
