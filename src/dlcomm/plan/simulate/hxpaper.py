"""HammingMesh (Hoefler et al., SC'22) Fig. 16 in the paper's own definitions.

``dlcomm simulate reproduce hammingmesh-paper``: the "relative cost saving" of Fig. 16 at
~1,024 accelerators as the paper's artifact (hxnet, docs/references.md) defines it,
beside dlcomm's own ``hammingmesh`` reproduction (performance per dollar, ``reproduce.py``):

    saving(Hx, X, W) = cost(X) O_X(W) / (cost(Hx) O_Hx(W))

with cost the network's cost only (``dlcomm.plan.prices.network_cost`` at dlcomm's
prices, on dlcomm's own build of each topology at 1,024 accelerators with 4 x 400 Gb/s
ports, as ``topo compare`` prices it) and O the communication overhead: simulated
iteration time minus compute time (the artifact's ``max_time - compute_time``). Steps:

1. The networks the artifact simulates (``general_bench.py``, ``emberLoad.py``): fat
   trees and the dragonfly with one 1,600 Gb/s link per accelerator (its abstraction of
   4 x 400G), leaves of 32 down-links and 32, 16 or 8 up-links (``32,32:32``,
   ``32,16:32``, ``32,8:32``: radix 64, 48 and 40 give dlcomm's sizing those leaves), the
   dragonfly 8:16:18:8; torus 32x32, HyperX 32x32, Hx2Mesh (2x2 boards in 16x16) and
   Hx4Mesh (4x4 in 8x8) with 400G per direction.
2. Its workloads and their overheads on dlcomm's fluid network (``hxpaper_model``).
3. Savings of Hx4Mesh and Hx2Mesh over each baseline beside the plotted values
   (``plot_cost_savings_diff_col.py``) and the artifact's own overheads, with relative
   errors, and two splits of each difference: our overheads at the cost ratios the plot
   implies, and the artifact's overheads at dlcomm's prices; the sensitivity of ResNet's
   saving to the per-message latency alpha (not an artifact parameter; default 1 us,
   dlcomm's own default).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlcomm.plan.collectives import bus_bandwidth
from dlcomm.plan.prices import Prices, network_cost
from dlcomm.plan.simulate.hxpaper_model import (
    AGGREGATION_S_PER_FLOAT,
    LINK_S,
    RESNET_RANKS,
    ROUTER_S,
    PaperNet,
    gpt_overhead,
    resnet_overhead,
)
from dlcomm.plan.topology import build_topology, sized_spec
from dlcomm.results import new_result

__all__ = ["NETWORKS", "BASELINES", "PAPER_SAVING", "PAPER_COST_VS_HX4", "ARTIFACT_OVERHEAD_S",
           "relative_saving", "reproduce_hammingmesh_paper", "nearly_15x"]

Say = Callable[[str], None] | None

ALPHAS_US = (0.0, 0.5, 1.0, 2.0)       # sensitivity of the result to alpha


@dataclass(frozen=True)
class PaperNetwork:
    key: str           # the artifact's name
    simulated: str     # dlcomm spec of the network the artifact simulates
    priced: str        # dlcomm's own build at 1,024 accelerators (4 x 400G ports)
    planes: int = 1    # 400G planes one simulated link stands for (cost as simulated)


NETWORKS = (
    PaperNetwork("fattree", "fattree:n=1024,ports=1,rate=1600,radix=64", "fattree:n=1024", 4),
    PaperNetwork("fattree50", "fattree:n=1024,taper=0.5,ports=1,rate=1600,radix=48",
                 "fattree:n=1024,taper=0.5", 4),
    PaperNetwork("fattree75", "fattree:n=1024,taper=0.75,ports=1,rate=1600,radix=40",
                 "fattree:n=1024,taper=0.75", 4),
    PaperNetwork("dragonfly", "dragonfly:g=8,a=16,p=8,h=18,ports=1,rate=1600",
                 "dragonfly:g=8", 4),
    PaperNetwork("hyperx", "hyperx2d:x=32,y=32", "hyperx2d:x=32,y=32"),
    PaperNetwork("torus", "torus2d:x=32,y=32", "torus2d:x=32,y=32"),
    PaperNetwork("hx2", "hxmesh:a=2,b=2,x=16,y=16", "hxmesh:a=2,b=2,x=16,y=16"),
    PaperNetwork("hx4", "hxmesh:a=4,b=4,x=8,y=8", "hxmesh:a=4,b=4,x=8,y=8"),
)
BASELINES = ("fattree", "fattree50", "fattree75", "dragonfly", "hyperx", "torus")
WORKLOADS = ("resnet152", "gpt3")

# Fig. 16 as plotted (plot_cost_savings_diff_col.py): HxMesh over each baseline.
PAPER_SAVING = {
    "hx4": {"resnet152": (7.76, 5.4, 4.06, 8.81, 4.37, 1.01),
            "gpt3": (1.53, 1.64, 1.53, 2.693, 2.0, 2.03298)},
    "hx2": {"resnet152": (3.72, 2.6, 1.96, 4.22, 2.10, 0.49),
            "gpt3": (1.41, 1.52, 1.41, 2.473, 1.84, 1.87)},
}
# Network cost / Hx4Mesh's that the plotted values imply with the artifact's overheads
# (solved from Fig. 16; unit prices are not in the artifact).
PAPER_COST_VS_HX4 = {"fattree": 9.36, "fattree50": 6.51, "fattree75": 4.90,
                     "dragonfly": 10.40, "hyperx": 3.99, "torus": 0.915, "hx2": 2.00,
                     "hx4": 1.00}
# The artifact's own overheads (results/ResNetSmall, results/GPT3Small: simulated time
# minus compute; GPT-3's 75% taper ran as fattree80).
ARTIFACT_OVERHEAD_S = {
    "resnet152": {"fattree": 1.711e-3, "fattree50": 1.711e-3, "fattree75": 1.711e-3,
                  "dragonfly": 1.752e-3, "hyperx": 2.271e-3, "torus": 2.286e-3,
                  "hx2": 2.166e-3, "hx4": 2.074e-3},
    "gpt3": {"fattree": 2.986e-3, "fattree50": 4.601e-3, "fattree75": 5.695e-3,
             "dragonfly": 4.721e-3, "hyperx": 9.091e-3, "torus": 40.463e-3,
             "hx2": 9.852e-3, "hx4": 18.172e-3},
}


def relative_saving(cost_x: float, overhead_x: float, cost_hx: float,
                    overhead_hx: float) -> float:
    """Fig. 16's relative cost saving of a HammingMesh over baseline X (above 1: cheaper)."""
    return (cost_x * overhead_x) / (cost_hx * overhead_hx)


# -- the reproduction -----------------------------------------------------------------------
def _cost(spec: str, prices: Prices) -> float:
    topo = build_topology(spec)
    return network_cost(topo.counts(), prices).per_accelerator


def _as_simulated_cost(pnet: PaperNetwork, prices: Prices) -> float:
    """The simulated network in 400G parts: a 1,600G link as ``planes`` 400G planes."""
    if pnet.planes == 1:
        return _cost(pnet.simulated, prices)
    return pnet.planes * _cost(pnet.simulated.replace("rate=1600", "rate=400"), prices)


def _err(value: float, ref: float) -> float:
    return value / ref - 1


def simulate_rows(say: Say = None, alpha_us: float = 1.0,
                  alphas_us: tuple[float, ...] = ()) -> dict[str, dict[str, Any]]:
    """Per network: costs, and per workload the overhead beside the artifact's; with
    ``alphas_us`` also ResNet's overhead at each of those alphas (``resnet_by_alpha_s``)."""
    prices = Prices()
    rows: dict[str, dict[str, Any]] = {}
    for pnet in NETWORKS:
        t0 = time.perf_counter()
        pn = PaperNet(pnet.simulated)
        row: dict[str, Any] = {"topology": pnet.key, "name": pn.topology.name,
                               "simulated_spec": pnet.simulated, "spec": pnet.priced,
                               "priced_name": build_topology(pnet.priced).name,
                               "accelerators": pn.topology.accelerators,
                               "cost_per_accel_usd": _cost(pnet.priced, prices),
                               "cost_as_simulated_per_accel_usd":
                                   _as_simulated_cost(pnet, prices),
                               "paper_cost_vs_hx4": PAPER_COST_VS_HX4[pnet.key]}
        for w, model in (("resnet152", resnet_overhead), ("gpt3", gpt_overhead)):
            out = model(pn, alpha_us * 1e-6)
            ref = ARTIFACT_OVERHEAD_S[w][pnet.key]
            out.update({"artifact_overhead_s": ref,
                        "overhead_error": _err(out["overhead_s"], ref),
                        "iteration_s": out["compute_s"] + out["overhead_s"],
                        "exposed_comm_s": out["overhead_s"]})
            row[w] = out
        row["resnet_by_alpha_s"] = {f"{a:g}": resnet_overhead(pn, a * 1e-6)["overhead_s"]
                                    for a in alphas_us}
        row["simulate_s"] = time.perf_counter() - t0
        rows[pnet.key] = row
        if say:
            say(f"{row['name']}: ${row['cost_per_accel_usd']:,.0f} per accelerator; overhead "
                + ", ".join(f"{w} {row[w]['overhead_s'] * 1e3:.3f} ms (artifact "
                            f"{row[w]['artifact_overhead_s'] * 1e3:.3f})" for w in WORKLOADS))
    hx4, ft = rows["hx4"], rows["fattree"]
    for row in rows.values():
        row["cost_vs_hx4"] = row["cost_per_accel_usd"] / hx4["cost_per_accel_usd"]
        for w in WORKLOADS:       # dlcomm's own metric beside, for its table
            row[w]["perf_per_dollar_vs_fattree"] = (
                ft[w]["iteration_s"] * ft["cost_per_accel_usd"]) / (
                row[w]["iteration_s"] * row["cost_per_accel_usd"])
    return rows


def saving_cells(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every cell of Fig. 16 (Hx4Mesh and Hx2Mesh over each baseline, both workloads):
    ours, the plotted value, the error, and the two splits (module docstring, step 3);
    each cell also lands in its baseline's row under ``saving``."""
    cells = []
    for hx in ("hx4", "hx2"):
        h = rows[hx]
        for i, b in enumerate(BASELINES):
            x = rows[b]
            for w in WORKLOADS:
                paper = PAPER_SAVING[hx][w][i]
                value = relative_saving(x["cost_per_accel_usd"], x[w]["overhead_s"],
                                        h["cost_per_accel_usd"], h[w]["overhead_s"])
                cell = {"hxmesh": hx, "baseline": b, "workload": w, "saving": value,
                        "paper": paper, "error": _err(value, paper),
                        "saving_at_paper_costs": relative_saving(
                            x["paper_cost_vs_hx4"], x[w]["overhead_s"],
                            h["paper_cost_vs_hx4"], h[w]["overhead_s"]),
                        "saving_with_artifact_overheads": relative_saving(
                            x["cost_per_accel_usd"], x[w]["artifact_overhead_s"],
                            h["cost_per_accel_usd"], h[w]["artifact_overhead_s"])}
                x.setdefault("saving", {}).setdefault(hx, {})[w] = cell
                cells.append(cell)
    return cells


def reproduce_hammingmesh_paper(say: Say = None, alpha_us: float = 1.0,
                                alphas_us: tuple[float, ...] = ALPHAS_US) -> dict[str, Any]:
    """Fig. 16 of HammingMesh in its own definitions (module docstring)."""
    start = time.perf_counter()
    rows = simulate_rows(say, alpha_us, alphas_us)
    cells = saving_cells(rows)
    ft, hx4 = rows["fattree"], rows["hx4"]
    head = {w: ft["saving"]["hx4"][w] for w in WORKLOADS}
    sensitivity = [{"alpha_us": a, "resnet152_hx4_vs_fattree": relative_saving(
        ft["cost_per_accel_usd"], ft["resnet_by_alpha_s"][f"{a:g}"],
        hx4["cost_per_accel_usd"], hx4["resnet_by_alpha_s"][f"{a:g}"])} for a in alphas_us]
    result = new_result("simulate-reproduce", {
        "reproduction": "hammingmesh-paper", "accelerators": RESNET_RANKS,
        "workloads": list(WORKLOADS), "topologies": [p.key for p in NETWORKS],
        "alpha_us": alpha_us, "link_latency_s": LINK_S, "router_latency_s": ROUTER_S,
        "aggregation_s_per_float": AGGREGATION_S_PER_FLOAT, "prices_usd": Prices().__dict__,
        "definition": "saving = cost(X) x O_X / (cost(Hx) x O_Hx); O = iteration - compute; "
                      "network cost only"})
    result["rows"] = list(rows.values())
    result["cells"] = cells
    result["summary"] = {
        "baseline": ft["name"],
        "hx4_vs_fattree": {w: {k: head[w][k] for k in ("saving", "paper", "error")}
                           for w in WORKLOADS},
        "within_15_percent": all(abs(head[w]["error"]) <= 0.15 for w in WORKLOADS),
        "max_abs_error": max(abs(c["error"]) for c in cells),
        "alpha_sensitivity": sensitivity,
        "depends_on": "costs of dlcomm's builds (fat tree: 4 x 400G ports, 3 levels); priced "
                      "as simulated (2 levels of 1,600G links) the savings would be ~28-35% "
                      "lower (docs/topology.md)",
        "published": "HammingMesh (SC'22) Fig. 16, relative cost saving (network cost x "
                     "communication overhead): Hx4Mesh over the non-blocking fat tree 7.76x "
                     "(ResNet-152) and 1.53x (GPT-3)",
        "wall_time_s": time.perf_counter() - start}
    return result


def nearly_15x(prices: Prices | None = None, sizes: tuple[int, ...] = (1024, 16384),
               nbytes: float = 1e9, alpha: float = 1e-6) -> list[dict[str, Any]]:
    """All-reduce bandwidth per network dollar, Hx4Mesh over the non-blocking fat tree
    (the *unverified* guess at the talk's "nearly 15x"): dlcomm's builds (one tree of
    4 x 400G ports), and the tree as 4 planes of 400G; bus bandwidth of each topology's
    best all-reduce of ``nbytes``."""
    prices = prices or Prices()
    out = []
    for n in sizes:
        row: dict[str, Any] = {"accelerators": n}
        for name, spec, planes in (("fattree", sized_spec("fattree", n), 1),
                                   ("fattree_4_planes", f"fattree:n={n},ports=1", 4),
                                   ("hx4", sized_spec("hxmesh:a=4", n), 1)):
            topo = build_topology(spec)
            best = topo.best_allreduce(nbytes, alpha)
            gbps = bus_bandwidth(topo.accelerators, nbytes, best.seconds) * 8 / 1e9 * planes
            cost = planes * network_cost(topo.counts(), prices).per_accelerator
            row[name] = {"spec": spec, "cost_per_accel_usd": cost, "allreduce_gbps": gbps,
                         "algorithm": best.algorithm, "gbps_per_kusd": gbps / cost * 1e3}
        for tree in ("fattree", "fattree_4_planes"):
            row[f"hx4_vs_{tree}"] = row["hx4"]["gbps_per_kusd"] / row[tree]["gbps_per_kusd"]
        out.append(row)
    return out
