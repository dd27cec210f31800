"""``topo compare``: topologies sized to about N accelerators, their cost and bandwidth.

For every topology spec (default ``COMPARE_SET``, each completed by ``sized_spec``):
counts -> cost (``prices``) -> bandwidth metrics (``bandwidth.measure``) -> optionally
the communication time of one training iteration of a catalog workload under a
parallelism (``traffic`` + ``commtime``). Every metric is also given per dollar relative
to the non-blocking fat tree (which is added when the set lacks it):

    (metric / cost per accelerator) / (same for the fat tree)

and for the communication time (fat tree time x cost) / (time x cost). The result is one
JSON document of kind ``topo-compare`` (schema in docs/topology.md), which the table and
the plot read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan.bandwidth import DEFAULT_ALLREDUCE_BYTES, DEFAULT_ALPHA_S, measure
from dlcomm.plan.prices import SOURCES, Prices, network_cost
from dlcomm.plan.topology import COMPARE_SET, build_topology, sized_spec
from dlcomm.plan.topology.base import LinkParams, Topology
from dlcomm.plan.topology.fattree import FatTree
from dlcomm.plan.traffic import Parallelism
from dlcomm.plots import save_figure
from dlcomm.results import new_result

__all__ = ["CompareConfig", "compare", "print_compare", "plot_compare", "RELATIVE_KEYS"]

# metric -> column label; all per accelerator
RELATIVE_KEYS = {"injection_gbps": "injection", "bisection_gbps_per_accel": "bisection",
                 "alltoall_gbps_per_accel": "all-to-all",
                 "permutation_gbps_per_accel": "permutation",
                 "allreduce_gbps_per_accel": "all-reduce"}


@dataclass(frozen=True)
class CompareConfig:
    accelerators: int
    params: LinkParams = field(default_factory=LinkParams)
    prices: Prices = field(default_factory=Prices)
    specs: tuple[str, ...] = COMPARE_SET
    workload: str | None = None
    parallelism: Parallelism | None = None
    placement: str = "linear"
    allreduce_bytes: float = DEFAULT_ALLREDUCE_BYTES
    alpha_s: float = DEFAULT_ALPHA_S
    permutations: int = 1
    seed: int = 0
    prices_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"accelerators": self.accelerators, "link_rate_gbps": self.params.rate_gbps,
                "ports": self.params.ports, "radix": self.params.radix,
                "topologies": list(self.specs), "workload": self.workload,
                "parallelism": self.parallelism.to_dict() if self.parallelism else None,
                "placement": self.placement, "allreduce_bytes": self.allreduce_bytes,
                "alpha_s": self.alpha_s, "permutations": self.permutations,
                "seed": self.seed, "prices_file": self.prices_file,
                "prices_usd": self.prices.__dict__, "price_sources": SOURCES}


def _is_baseline(topo: Topology) -> bool:
    return isinstance(topo, FatTree) and topo.taper == 0 and not topo.ina


def _row(topo: Topology, cfg: CompareConfig, comms: list | None) -> dict[str, Any]:
    from dlcomm.plan.commtime import comm_times
    from dlcomm.plan.flownet import FlowNet

    start = time.perf_counter()
    counts = topo.counts()
    cost = network_cost(counts, cfg.prices)
    net = FlowNet.from_graph(topo.graph())
    bw = measure(topo, nbytes=cfg.allreduce_bytes, alpha=cfg.alpha_s,
                 permutations=cfg.permutations, seed=cfg.seed, net=net)
    n = topo.accelerators
    row: dict[str, Any] = {
        "name": topo.name, "spec": topo.spec, "kind": topo.kind, "accelerators": n,
        "cost": cost.total, "cost_per_accel": cost.per_accelerator,
        "cost_items": cost.items, "counts": counts.to_dict(),
        "switched_port_fraction": counts.switched_ports / counts.accelerator_ports,
        "long_cable_port_fraction": counts.long_cable_ports / counts.accelerator_ports,
        **bw.to_dict(),
        "bisection_gbps_per_accel": 2 * bw.bisection_gbps / n,
        "comm_time_s": None, "comm": None,
    }
    if comms is not None and cfg.parallelism is not None:
        times = comm_times(topo, net, comms, cfg.parallelism, cfg.placement, cfg.alpha_s,
                           cfg.seed)
        row["comm"] = [t.to_dict() for t in times]
        row["comm_time_s"] = sum(t.seconds for t in times)
    row["usd_per_gbps"] = {label: row["cost_per_accel"] / row[key] if row[key] else None
                           for key, label in RELATIVE_KEYS.items()}
    row["seconds"] = time.perf_counter() - start
    return row


def _relative(row: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, label in RELATIVE_KEYS.items():
        mine, theirs = row[key] / row["cost_per_accel"], base[key] / base["cost_per_accel"]
        out[label] = mine / theirs if theirs else None
    if row["comm_time_s"] and base["comm_time_s"]:
        out["comm_time"] = (base["comm_time_s"] * base["cost_per_accel"]) / (
            row["comm_time_s"] * row["cost_per_accel"])
    else:
        out["comm_time"] = None
    return out


def compare(cfg: CompareConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the comparison; returns the ``topo-compare`` result (not yet written)."""
    started = time.perf_counter()
    topos = [build_topology(sized_spec(s, cfg.accelerators, cfg.params), cfg.params)
             for s in cfg.specs]
    if not any(_is_baseline(t) for t in topos):
        topos.insert(0, build_topology(sized_spec("fattree", cfg.accelerators, cfg.params),
                                       cfg.params))
    comms = None
    model_facts = None
    if cfg.workload:
        from dlcomm.plan.traffic import iteration_traffic
        from dlcomm.workloads.catalog import get_model

        model = get_model(cfg.workload)
        par = cfg.parallelism or Parallelism(dp=min(t.accelerators for t in topos))
        small = [t.name for t in topos if t.accelerators < par.world]
        if small:
            raise ConfigError(f"parallelism needs {par.world} accelerators; "
                              f"{', '.join(small)} ha{'s' if len(small) == 1 else 've'} fewer")
        cfg = replace(cfg, parallelism=par)
        comms = iteration_traffic(model, par)
        model_facts = {"name": model.name, "family": model.family, "params": model.params,
                       "resolved_parallelism": par.resolved(model).to_dict(),
                       "traffic": [c.to_dict() for c in comms]}
    rows = []
    for topo in topos:
        rows.append(_row(topo, cfg, comms))
        if progress:
            progress(f"{topo.name}: {rows[-1]['seconds']:.1f} s")
    base = next(r for r, t in zip(rows, topos) if _is_baseline(t))
    for row in rows:
        row["per_dollar_vs_fattree"] = _relative(row, base)
    result = new_result("topo-compare", cfg.to_dict())
    result["workload"] = model_facts
    result["topologies"] = rows
    best = {}
    for label in [*RELATIVE_KEYS.values(), "comm_time"]:
        scored = [(r["per_dollar_vs_fattree"][label], r["name"]) for r in rows
                  if r["per_dollar_vs_fattree"][label] is not None]
        if scored:
            best[label] = max(scored)[1]
    result["summary"] = {"baseline": base["name"], "topologies": len(rows),
                         "accelerators_requested": cfg.accelerators,
                         "best_per_dollar": best,
                         "elapsed_s": time.perf_counter() - started}
    return result


def _money(usd: float) -> str:
    return f"${usd / 1e6:,.1f}M" if usd >= 1e6 else f"${usd / 1e3:,.0f}k"


def print_compare(result: dict[str, Any], json_path: str | None = None) -> None:
    """Two rich tables: absolute numbers, then per dollar relative to the fat tree."""
    from rich.console import Console
    from rich.table import Table

    rows = result["topologies"]
    workload = result.get("workload")
    console = Console() if sys.stdout.isatty() else Console(width=170)
    title = (f"dlcomm topo compare: ~{result['config']['accelerators']} accelerators, "
             f"{result['config']['ports']} x {result['config']['link_rate_gbps']:g} Gb/s "
             f"ports, radix {result['config']['radix']} (bandwidth in Gb/s per accelerator)")
    table = Table(title=title, title_justify="left")
    for col in ("topology", "accel", "cost", "$/accel", "inject", "bisect", "all-to-all",
                "(cut bound)", "permut.", "all-reduce"):
        table.add_column(col, justify="left" if col == "topology" else "right")
    if workload:
        table.add_column(f"comm/iter {workload['name']}", justify="right")
    for r in rows:
        cells = [r["name"], f"{r['accelerators']:,}", _money(r["cost"]),
                 f"{r['cost_per_accel']:,.0f}", f"{r['injection_gbps']:,.0f}",
                 f"{r['bisection_gbps_per_accel']:,.0f}", f"{r['alltoall_gbps_per_accel']:,.0f}",
                 f"{r['alltoall_bound_gbps_per_accel']:,.0f}",
                 f"{r['permutation_gbps_per_accel']:,.0f}",
                 f"{r['allreduce_gbps_per_accel']:,.0f} {r['allreduce_algorithm']}"]
        if workload:
            cells.append(f"{r['comm_time_s'] * 1e3:,.1f} ms")
        table.add_row(*cells)
    console.print(table)
    rel = Table(title=f"per dollar, relative to the {result['summary']['baseline']}",
                title_justify="left")
    labels = [*RELATIVE_KEYS.values()] + (["comm_time"] if workload else [])
    rel.add_column("topology")
    for label in labels:
        rel.add_column(label.replace("_", " "), justify="right")
    for r in rows:
        rel.add_row(r["name"], *[f"{r['per_dollar_vs_fattree'][k]:.2f}x"
                                 if r["per_dollar_vs_fattree"][k] is not None else "-"
                                 for k in labels])
    if json_path:
        rel.caption = f"JSON result: {json_path}"
    console.print(rel)


def plot_compare(result: dict[str, Any], path: str | Path) -> Path:
    """Cost per accelerator and bandwidth per dollar relative to the fat tree (bars)."""
    from dlcomm.plots import pyplot
    plt = pyplot()
    import numpy as np

    rows = result["topologies"]
    names = [r["name"] for r in rows]
    labels = [*RELATIVE_KEYS.values()]
    if result.get("workload"):
        labels.append("comm_time")
    fig, (ax_cost, ax_rel) = plt.subplots(1, 2, figsize=(14, 5),
                                          gridspec_kw={"width_ratios": [1, 2.4]})
    ax_cost.barh(names, [r["cost_per_accel"] for r in rows], color="tab:gray")
    ax_cost.invert_yaxis()
    ax_cost.set_xlabel("network cost per accelerator (USD)")
    ax_cost.grid(axis="x", alpha=0.3)
    x = np.arange(len(rows))
    width = 0.8 / len(labels)
    for k, label in enumerate(labels):
        values = [r["per_dollar_vs_fattree"][label] or 0 for r in rows]
        ax_rel.bar(x + (k - (len(labels) - 1) / 2) * width, values, width, label=label)
    ax_rel.axhline(1.0, color="black", lw=0.8)
    ax_rel.set_yscale("log")
    ax_rel.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax_rel.set_ylabel(f"per dollar / {result['summary']['baseline']}")
    ax_rel.grid(axis="y", alpha=0.3)
    ax_rel.legend(fontsize=8, ncol=3)
    fig.suptitle(f"dlcomm topo compare: ~{result['config']['accelerators']} accelerators")
    fig.tight_layout()

    return save_figure(fig, path)
