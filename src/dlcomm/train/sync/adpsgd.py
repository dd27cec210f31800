"""AD-PSGD's roles and bookkeeping (Lian et al., "Asynchronous Decentralized Parallel
Stochastic Gradient Descent", ICML'18). Pure: no sockets, no tensors.

Every worker computes gradients at its own pace and averages its model with one neighbour
at a time, without any global barrier::

    active worker i (a loop):             passive worker j (a loop, plus a server):
      1. g = gradient at its model x_i      1. g = gradient at its model x_j
      2. pick a random passive neighbour j  2. x_j = x_j - lr * step(g)
      3. x_i, x_j <- (x_i + x_j) / 2           server: on a request from i, reply x_j and set
         (atomically: i sends x_i, j          x_j <- (x_j + x_i) / 2 under the model lock
         replies x_j and averages)
      4. x_i = x_i - lr * step(g)

The graph is split into two colour classes (the paper's bipartite variant): actives only
initiate averaging and passives only serve it, so no two workers ever wait on each other
in a cycle (no deadlock), while each passive's server runs concurrently with its
gradient computation. A gradient may thus be applied to a model that was averaged since
it was computed; the paper bounds this staleness in its analysis.

Ending: an active that has taken its steps (or heard the end) tells every passive
neighbour; a passive that has taken its steps marks its replies with the end; the first
worker to finish thus ends the run within a few exchanges.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dlcomm.errors import ConfigError
from dlcomm.train.sync.graphs import Graph

__all__ = ["Roles", "split_roles", "PassiveBook"]


@dataclass(frozen=True)
class Roles:
    """Which ranks initiate averaging (active) and which serve it (passive)."""

    active: frozenset[int]
    partners: dict[int, tuple[int, ...]]   # rank -> neighbours of the other role

    def is_active(self, rank: int) -> bool:
        return rank in self.active

    def choose(self, rank: int, rng: random.Random) -> int:
        """An active worker's partner for this step: a uniformly random passive neighbour."""
        return rng.choice(self.partners[rank])


def split_roles(graph: Graph) -> Roles:
    """Active = rank 0's colour class of a two-colouring of ``graph``."""
    colour = graph.two_colouring()
    if colour is None:
        raise ConfigError(f"adpsgd needs a bipartite graph (its active/passive split); "
                          f"{graph.name} over {graph.n} workers is not (try graph=bipartite, "
                          "or graph=ring with an even number of workers)")
    active = frozenset(r for r in range(graph.n) if colour[r] == 0)
    partners = {r: graph.neighbours(r) for r in range(graph.n)}
    return Roles(active, partners)


class PassiveBook:
    """A passive worker's server state: which active neighbours have ended, gaps seen."""

    def __init__(self, rank: int, actives: tuple[int, ...]) -> None:
        self.rank = rank
        self.actives = frozenset(actives)
        self.ended: set[int] = set()
        self.ending = False          # this worker has finished: replies carry the end
        self.requests = 0
        self.max_step_gap = 0

    def on_request(self, src: int, src_steps: int, own_steps: int) -> bool:
        """An averaging request from ``src``; returns the end flag for the reply."""
        if src not in self.actives:
            raise ValueError(f"adpsgd: rank {src} is not an active neighbour of {self.rank}")
        self.requests += 1
        self.max_step_gap = max(self.max_step_gap, abs(src_steps - own_steps))
        return self.ending

    def on_end(self, src: int) -> None:
        if src not in self.actives:
            raise ValueError(f"adpsgd: rank {src} is not an active neighbour of {self.rank}")
        self.ended.add(src)

    @property
    def stop_requested(self) -> bool:
        return bool(self.ended) or self.ending

    @property
    def all_ended(self) -> bool:
        return self.ended == self.actives
