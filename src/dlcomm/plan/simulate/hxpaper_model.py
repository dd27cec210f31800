"""The HammingMesh artifact's workloads on dlcomm's fluid network (``hammingmesh-paper``).

The hxnet artifact (docs/references.md, HammingMesh) simulates Fig. 16's workloads as SST
ember motifs; this module runs the same messages on a planner topology:

1. ResNet-152 (``emberresnet152.cc``), data parallel over 1,024 ranks: forward 36 ms,
   then 10 backward chunks of 7.2 ms; after chunk k the fp32 all-reduce of bucket k starts
   (sizes rounded down to multiples of 4 x 1,024 floats) and overlaps the later chunks.
   Algorithm 05D (one unidirectional ring over the ranks in order) on fat trees and the
   dragonfly; 25D (rings both ways on two edge-disjoint Hamiltonian cycles of the 32x32
   grid, a quarter of the data each) on the torus, HyperX and HammingMeshes.
2. GPT-3 (``embergpt3.cc``) on 384 of the 1,024 accelerators: 96 pipeline stages x 4-way
   tensor parallelism, no DP; TP groups {s, s+96, s+192, s+288}, stage s = rank mod 96;
   ranks 0..383 on fat trees and the dragonfly, rank r at grid (r mod 16, r div 16)
   elsewhere (``generateNidList*("..._24x16")``, ``px=16``). One step: even stages compute
   15.915 ms, odd 31.83 ms, then two blocking 05D all-reduces of 100.66 MB over the TP
   group and one 100.66 MB send to the paired stage (even to s+1, odd to s-1).
3. Time: every collective is a latency, its reduction compute (the motifs' 0.01 ns per
   float reduced) and a transfer of its bytes per flow at its pattern's rate
   (``fluid.SimNetwork``); buckets and the two stage parities run as concurrent chains
   whose transfers share links max-min fairly (``fluid.Sharing``). A ring of s steps pays
   s (alpha + its mean per-message path latency): each step waits for its predecessor's,
   so the chain of steps walks the ring's edges. Path latency is the artifact's 40 ns per
   link and 40 ns per router (``defaultParams.py``: link_lat, input + output latency) on
   the path the artifact builds: NIC-leaf-NIC (two more levels across leaves) in fat
   trees, a router per switch in the dragonfly, an accelerator router and a NIC link at
   both ends in the direct networks. ``alpha`` (per message) is not an artifact
   parameter: the caller chooses it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlcomm.plan.flows import route_matrix
from dlcomm.plan.simulate.fluid import Sharing, SimNetwork
from dlcomm.plan.topology import Dragonfly, FatTree, Topology, build_topology

__all__ = ["hamiltonian_cycles", "Transfer", "PaperNet", "resnet_overhead", "gpt_overhead",
           "gpt_placement", "LINK_S", "ROUTER_S", "AGGREGATION_S_PER_FLOAT",
           "RESNET_BUCKETS", "RESNET_RANKS", "GPT_BYTES"]

LINK_S, ROUTER_S = 40e-9, 40e-9        # defaultParams.py: link_lat; input + output latency
AGGREGATION_S_PER_FLOAT = 0.01e-9      # the motifs' aggregation_cost_ns
RESNET_BUCKETS = (6511592, 6567936, 5905920, 6113280, 6176256, 6112768, 6176256, 6112768,
                  5321216, 5194816)     # float32 elements (emberresnet152.h, NUM_B = 10)
RESNET_FWD_S, RESNET_BWD_S = 36e-3, 7.2e-3     # per iteration / per bucket at 1,024 ranks
RESNET_RANKS = 1024
GPT_STAGES, GPT_TP, GPT_PX = 96, 4, 16
GPT_BYTES = 25165824 * 4               # 2048 x 12288 float32: TP all-reduce and p2p
GPT_FWD_S, GPT_BWD_S = 15.915e-3, 31.83e-3


def hamiltonian_cycles(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two edge-disjoint Hamiltonian cycles of the n x n torus as successor arrays over
    cells x + n y: the first runs along rows and turns up at x = -y (mod n), the second
    runs up columns and turns right there (checked: each visits all n^2 cells)."""
    x, y = np.meshgrid(np.arange(n), np.arange(n), indexing="xy")
    x, y = x.ravel(), y.ravel()
    turn = x == (-y) % n
    right, up = (x + 1) % n + n * y, x + n * ((y + 1) % n)
    return np.where(turn, up, right), np.where(turn, right, up)


# -- the network --------------------------------------------------------------------------
@dataclass(frozen=True)
class Transfer:
    pattern: Any       # key of a SimNetwork pattern (every flow of weight 1)
    nbytes: float      # bytes per flow
    latency_s: float
    compute_s: float = 0.0


class PaperNet:
    """One simulated network: its patterns, path latencies and concurrent chains."""

    def __init__(self, spec: str) -> None:
        self.topology: Topology = build_topology(spec)
        n = self.topology.accelerators
        self.net = SimNetwork(self.topology, np.arange(n))
        coords = self.net.grid_coords()
        self.grid = None
        if coords is not None:
            side = int(coords.max()) + 1
            self.grid = np.full((side, side), -1)
            self.grid[coords[:, 0], coords[:, 1]] = np.arange(n)

    def path_latency_s(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Links x 40 ns + routers x 40 ns of each flow's path as the artifact builds it."""
        topo = self.topology
        if isinstance(topo, FatTree):
            same = src // topo.per_leaf == dst // topo.per_leaf
            links = np.where(same, 2, 2 * topo.clos.levels)
            routers = links - 1
        else:
            node = self.net.node
            hops = np.asarray(route_matrix(self.net.net, node[src], node[dst]).sum(axis=0))
            hops = hops.ravel()
            direct = not isinstance(topo, Dragonfly)    # every accelerator a router
            links = hops + (2 if direct else 0)
            routers = hops + (1 if direct else -1)
        return links * LINK_S + routers * ROUTER_S

    def pattern(self, key: str, src: np.ndarray, dst: np.ndarray) -> str:
        self.net.flows(key, src, dst)
        return key

    def ring_latency_s(self, rings: list[tuple[np.ndarray, np.ndarray]], steps: int,
                       alpha: float) -> float:
        """steps x (alpha + the slowest ring's mean path latency)."""
        mean = max(float(self.path_latency_s(s, d).mean()) for s, d in rings)
        return steps * (alpha + mean)

    def run(self, chains: list[tuple[float, list[Transfer]]]) -> float:
        """Run chains of transfers (each from its start time, one transfer after another,
        concurrent chains sharing links max-min fairly); the time the last one ends."""
        keys = sorted({t.pattern for _, ts in chains for t in ts})
        sharing = Sharing([self.net.patterns[k] for k in keys], self.net.cap_Bps)
        idx = [0] * len(chains)
        ready = [start + ts[0].latency_s + ts[0].compute_s for start, ts in chains]
        left = [ts[0].nbytes for _, ts in chains]
        end, now = 0.0, 0.0
        live = set(range(len(chains)))
        while live:
            moving = [i for i in live if ready[i] <= now]
            rates = sharing.rates(Counter(chains[i][1][idx[i]].pattern for i in moving)) \
                if moving else {}
            waits = [ready[i] - now for i in live if ready[i] > now]
            drains = [left[i] / rates[chains[i][1][idx[i]].pattern] for i in moving]
            step = min(waits + drains)
            now += step
            for i in moving:
                left[i] -= rates[chains[i][1][idx[i]].pattern] * step
            for i in list(live):
                if ready[i] <= now and left[i] <= 1e-6 * max(chains[i][1][idx[i]].nbytes, 1):
                    idx[i] += 1
                    if idx[i] == len(chains[i][1]):
                        live.discard(i)
                        end = max(end, now)
                    else:
                        nxt = chains[i][1][idx[i]]
                        ready[i], left[i] = now + nxt.latency_s + nxt.compute_s, nxt.nbytes
        return end


# -- the workloads ------------------------------------------------------------------------
def _ring_flows(order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return order, np.roll(order, -1)


def resnet_overhead(pn: PaperNet, alpha: float) -> dict[str, Any]:
    """ResNet-152: 10 buckets all-reduced as backward proceeds; O = end - compute."""
    g = RESNET_RANKS
    if pn.grid is None:
        rings = [_ring_flows(np.arange(g))]            # 05D: one unidirectional ring
        algorithm, share = "05D ring", 1.0
    else:
        side = pn.grid.shape[0]
        cells = np.arange(side * side)
        acc = pn.grid[cells % side, cells // side]
        rings = []
        for succ in hamiltonian_cycles(side):         # 25D: 2 cycles, both directions
            rings += [(acc, acc[succ]), (acc[succ], acc)]
        algorithm, share = "25D Hamiltonian rings", 1 / len(rings)
    key = pn.pattern("resnet:" + algorithm, np.concatenate([s for s, _ in rings]),
                     np.concatenate([d for _, d in rings]))
    latency = pn.ring_latency_s(rings, 2 * (g - 1), alpha)
    chains = []
    for k, floats in enumerate(RESNET_BUCKETS):
        floats -= floats % (4 * g)                     # temp_fix_all_reduce_size
        nbytes = 2 * (g - 1) / g * floats * 4 * share
        agg = (g - 1) / g * floats * AGGREGATION_S_PER_FLOAT
        chains.append((RESNET_FWD_S + (k + 1) * RESNET_BWD_S,
                       [Transfer(key, nbytes, latency, agg)]))
    compute = RESNET_FWD_S + len(RESNET_BUCKETS) * RESNET_BWD_S
    end = pn.run(chains)
    return {"overhead_s": end - compute, "compute_s": compute, "algorithm": algorithm,
            "ring_latency_s": latency}


def gpt_placement(pn: PaperNet) -> np.ndarray:
    """Accelerator of each of the 384 ranks (module docstring, step 2)."""
    r = np.arange(GPT_STAGES * GPT_TP)
    if pn.grid is None:
        return r
    return pn.grid[r % GPT_PX, r // GPT_PX]


def gpt_overhead(pn: PaperNet, alpha: float) -> dict[str, Any]:
    """GPT-3: per parity, two blocking TP all-reduces and the p2p send; O = end - 31.83 ms."""
    acc = gpt_placement(pn)
    g, chains = GPT_TP, []
    for parity, start, peer in ((0, GPT_FWD_S, 1), (1, GPT_BWD_S, -1)):
        stages = np.arange(parity, GPT_STAGES, 2)
        groups = acc[stages[:, None] + GPT_STAGES * np.arange(g)[None, :]]   # (48, 4)
        rings = [_ring_flows(row) for row in groups]
        tp = pn.pattern(f"gpt:tp{parity}", groups.ravel(), np.roll(groups, -1, 1).ravel())
        senders = np.flatnonzero(np.arange(len(acc)) % 2 == parity)
        src, dst = acc[senders], acc[senders + peer]
        p2p = pn.pattern(f"gpt:p2p{parity}", src, dst)
        ar = Transfer(tp, 2 * (g - 1) / g * GPT_BYTES, pn.ring_latency_s(rings, 2 * (g - 1),
                                                                          alpha),
                      (g - 1) / g * GPT_BYTES / 4 * AGGREGATION_S_PER_FLOAT)
        send = Transfer(p2p, GPT_BYTES, alpha + float(pn.path_latency_s(src, dst).max()))
        chains.append((start, [ar, ar, send]))
    end = pn.run(chains)
    return {"overhead_s": end - GPT_BWD_S, "compute_s": GPT_BWD_S,
            "algorithm": "05D ring (TP), p2p"}


