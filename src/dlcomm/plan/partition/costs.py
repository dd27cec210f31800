"""Cost of every (layer, type) and every edge at one node of the partition hierarchy.

A node splits its sub-problem between p sides (p = 2 in AccPar's binary hierarchy). Side k
has aggregate throughput ``P_k`` (FLOP/s, the sum over its devices of peak x efficiency)
and bandwidth ``b_k`` (bytes/s across this split: its devices' links added up). With the
node's sub-problem of layer l (batch ``B'``, C_in share ``fin``, C_out share ``fout``),
sizes in elements are (docs/references.md: AccPar):

    |W| = params fin fout            |F_l| = |E_l| = in_elems B' fin
    |F_{l+1}| = |E_{l+1}| = out_elems B' fout
    C = (3 or 2) flops B' fin fout   (training = forward + 2 x forward; 2 when the layer
                                      reads the network input and needs no input gradient)

Cost of layer l with type t and shares alpha (the per-side fractions of the split dim):

1. compute on side k: ``alpha_k C_split + C_repl`` FLOPs at ``P_k``. The owned layers'
   FLOPs (see graph.py) are split with the output, except under type II (FULL output);
2. intra-layer communication: an all-reduce of the partial sums, ``n`` elements with
   ``n = |W| (+ owned params)`` for I, ``|F_{l+1}|`` for II, ``|E_l|`` for III (0 when
   no input gradient is needed). As a reduce-scatter plus all-gather with equal ownership
   every side sends and receives ``2 (p-1)/p n`` (``n`` for two sides), in ``n s / b_k``;
3. the heterogeneous split ratio (closed form): both sides finish together when
   ``alpha_k C_split / P_k + c_k = T`` for all k, with ``c_k = C_repl / P_k + intra_k / b_k``
   (all linear in alpha). With ``sum alpha_k = 1``:
   ``T = (C_split + sum_k P_k c_k) / sum_k P_k`` and ``alpha_k = (T - c_k) P_k / C_split``;
   a side with ``alpha_k < 0`` gets nothing and T is solved again without it. For two
   sides: ``alpha = (C/P_j + c_j - c_i) / (C/P_i + C/P_j)``, clipped to [0, 1];
4. the layer's time at this node is the slower side: ``max_k (compute_k/P_k + intra_k/b_k)``.

Edges (transitions and joins, layouts.py) move ``fraction x |tensor|`` per side; an edge's
time is ``max_k max(received_k, sent_k) / b_k`` (full-duplex links). Every cost is a
function of one layer's type or of one edge's two types, which is what makes the dynamic
programme exact (dp.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlcomm.plan.partition.graph import PartitionGraph
from dlcomm.plan.partition.layouts import TYPES, join_transition, transition
from dlcomm.volume import ring_allreduce_factor

__all__ = ["SubProblem", "Sides", "LevelCosts", "layer_sizes", "balance_shares",
           "level_costs", "allreduce_elems"]


@dataclass(frozen=True)
class SubProblem:
    """The part of every layer one node of the hierarchy works on (arrays over nodes)."""

    batch: np.ndarray   # samples
    fin: np.ndarray     # fraction of C_in
    fout: np.ndarray    # fraction of C_out

    @classmethod
    def whole(cls, n: int, batch: float) -> SubProblem:
        return cls(np.full(n, float(batch)), np.ones(n), np.ones(n))

    def key(self) -> bytes:
        return self.batch.tobytes() + self.fin.tobytes() + self.fout.tobytes()

    def children(self, types: np.ndarray, shares: np.ndarray) -> list[SubProblem]:
        """The sub-problems of the sides after splitting layer l by ``types[l]``, ``shares[l]``."""
        out = []
        for k in range(shares.shape[1]):
            a = shares[:, k]
            out.append(SubProblem(np.where(types == 0, self.batch * a, self.batch),
                                  np.where(types == 1, self.fin * a, self.fin),
                                  np.where(types == 2, self.fout * a, self.fout)))
        return out


@dataclass(frozen=True)
class Sides:
    """The parts a node splits into."""

    flops: np.ndarray      # (p,) FLOP/s of each side (its devices' peak x efficiency, summed)
    bandwidth: np.ndarray  # (p,) bytes/s each side sends and receives across this split
    devices: np.ndarray    # (p,) devices per side
    memory: np.ndarray     # (p,) bytes of memory of the smallest device of each side

    @property
    def p(self) -> int:
        return len(self.flops)


def layer_sizes(graph: PartitionGraph, sub: SubProblem) -> dict[str, np.ndarray]:
    """Element and FLOP counts of every layer's sub-problem (module docstring)."""
    a = graph.arrays
    cut = sub.fin * sub.fout
    return {
        "W": a["params"] * cut,
        "fold_params": a["fold_params"] * sub.fout,
        "F_in": a["in_elems"] * sub.batch * sub.fin,
        "F_out": a["out_elems"] * sub.batch * sub.fout,
        "C": a["flops"] * sub.batch * cut * np.where(a["takes_input"], 2.0, 3.0),
        "C_fold": 3.0 * a["fold_flops"] * sub.batch * sub.fout,
        "act_fold": a["fold_elems"] * sub.batch * sub.fout,
    }


def allreduce_elems(n: np.ndarray | float, p: int) -> np.ndarray:
    """Elements one side sends (= receives) in a reduce-scatter + all-gather of ``n``."""
    return np.asarray(n, dtype=float) * ring_allreduce_factor(p)


def balance_shares(split: np.ndarray, fixed: np.ndarray, flops: np.ndarray) -> np.ndarray:
    """Shares so that every side finishes together (step 3 of the module docstring).

    ``split`` (...,) FLOPs divided by the shares; ``fixed`` (..., p) seconds each side spends
    regardless of its share; ``flops`` (p,) throughput. Returns shares (..., p) summing to 1.
    """
    split = np.asarray(split, dtype=float)[..., None]
    fixed = np.asarray(fixed, dtype=float)
    p_k = np.broadcast_to(flops, fixed.shape)
    active = np.ones(fixed.shape, dtype=bool)
    safe = np.where(split > 0, split, 1.0)
    for _ in range(fixed.shape[-1]):
        weight = np.where(active, p_k, 0.0)
        t = (split + (weight * fixed).sum(-1, keepdims=True)) / weight.sum(-1, keepdims=True)
        shares = np.where(active, (t - fixed) * p_k / safe, 0.0)
        negative = shares < 0
        if not negative.any():
            break
        active &= ~negative
    shares = np.clip(shares, 0.0, None)
    total = shares.sum(-1, keepdims=True)
    proportional = p_k / p_k.sum(-1, keepdims=True)
    return np.where((split > 0) & (total > 0), shares / np.where(total > 0, total, 1.0),
                    proportional)


@dataclass(frozen=True)
class LevelCosts:
    """Costs at one node: per layer and type, per edge and pair of types (seconds, bytes)."""

    shares: np.ndarray       # (N, 3, p) split of the type's dimension
    compute: np.ndarray      # (N, 3, p) s, compute of side k at its aggregate throughput
    intra: np.ndarray        # (N, 3, p) s, intra-layer communication of side k
    intra_bytes: np.ndarray  # (N, 3, p) bytes side k sends (= receives) inside the layer
    unary: np.ndarray        # (N, 3) s, the layer's time at this node: max_k(compute + intra)
    memory: np.ndarray       # (N, 3, p) bytes the layer needs on side k (the whole side)
    edge_time: np.ndarray    # (E, 3, 3) s, [type of src][type of dst]
    edge_recv: np.ndarray    # (E, 3, 3, p) bytes side k receives
    edge_sent: np.ndarray    # (E, 3, 3, p) bytes side k sends


def level_costs(graph: PartitionGraph, sub: SubProblem, sides: Sides, *,
                balanced: bool = True, bytes_per_element: float = 2.0,
                weight_copies: float = 3.0) -> LevelCosts:
    """All costs of one node (module docstring); ``balanced=False`` splits equally."""
    n, p = len(graph), sides.p
    s = layer_sizes(graph, sub)
    bpe = bytes_per_element
    intra_n = np.stack([s["W"] + s["fold_params"], s["F_out"],
                        np.where(graph.arrays["takes_input"], 0.0, s["F_in"])], axis=1)
    intra_bytes = allreduce_elems(intra_n, p)[..., None] * bpe * np.ones(p)  # (N, 3, p)
    intra = intra_bytes / sides.bandwidth
    split = np.stack([s["C"] + s["C_fold"], s["C"], s["C"] + s["C_fold"]], axis=1)  # (N, 3)
    repl = np.stack([np.zeros(n), s["C_fold"], np.zeros(n)], axis=1)
    fixed = repl[..., None] / sides.flops + intra
    if balanced:
        shares = balance_shares(split, fixed, sides.flops)
    else:
        shares = np.full((n, 3, p), 1.0 / p)
    compute = (shares * split[..., None] + repl[..., None]) / sides.flops
    unary = (compute + intra).max(-1)

    # memory of the layer on side k: weights (with gradients and optimizer state) and the
    # activations kept for backward, in the side's child sub-problem; per type, which of
    # them the split divides (the others are replicated)
    full = np.ones((n, p))
    w_part = np.stack([full, shares[:, 1], shares[:, 2]], axis=1)          # W: II, III
    fold_part = np.stack([full, full, shares[:, 2]], axis=1)               # owned params: III
    in_part = np.stack([shares[:, 0], shares[:, 1], full], axis=1)         # F_in: I, II
    out_part = np.stack([shares[:, 0], full, shares[:, 2]], axis=1)        # output: I, III
    memory = bpe * (weight_copies * (s["W"][:, None, None] * w_part
                                     + s["fold_params"][:, None, None] * fold_part)
                    + s["F_in"][:, None, None] * in_part
                    + s["act_fold"][:, None, None] * out_part)

    e = len(graph.edges)
    edge_time = np.zeros((e, 3, 3))
    edge_recv = np.zeros((e, 3, 3, p))
    edge_sent = np.zeros((e, 3, 3, p))
    if e:
        src = np.array([x.src for x in graph.edges])
        dst = np.array([x.dst for x in graph.edges])
        is_join = np.array([x.kind == "join" for x in graph.edges])
        per_sample = np.array([float(x.elems) for x in graph.edges])
        dim = np.where(is_join, sub.fout[dst], sub.fin[dst])
        tensor_bytes = per_sample * sub.batch[dst] * dim * bpe  # (E,)
        for a in TYPES:
            for b in TYPES:
                r_in, s_in = transition(a, shares[src, a], b, shares[dst, b])
                r_j, s_j = join_transition(a, shares[src, a], b, shares[dst, b])
                recv = np.where(is_join[:, None], r_j, r_in) * tensor_bytes[:, None]
                sent = np.where(is_join[:, None], s_j, s_in) * tensor_bytes[:, None]
                edge_recv[:, a, b] = recv
                edge_sent[:, a, b] = sent
                edge_time[:, a, b] = (np.maximum(recv, sent) / sides.bandwidth).max(-1)
    return LevelCosts(shares, compute, intra, intra_bytes, unary, memory, edge_time,
                      edge_recv, edge_sent)
