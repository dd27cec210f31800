"""The ``kind: partition`` JSON result, its table and its plot (schema in docs/partition.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dlcomm.plan.partition.hierarchy import HEADLINE, Plan
from dlcomm.plan.partition.layouts import PartType
from dlcomm.plots import save_figure
from dlcomm.results import new_result

__all__ = ["scheme_entry", "partition_result", "execution_entry", "print_partition",
           "plot_partition"]

_TYPE = [t.label for t in PartType]


def _levels(plan: Plan) -> list[dict[str, Any]]:
    names = plan.graph.names
    out = []
    for depth, nodes in enumerate(plan.levels(), start=1):
        entries = []
        for node, count in nodes:
            entries.append({
                "devices": [plan.cluster.describe(a, b) for a, b in node.parts],
                "count": count,
                "objective_s": node.objective,
                "time_s": float(node.time.sum()),
                "layers": [{"layer": names[i], "type": _TYPE[int(node.types[i])],
                            "ratio": [float(x) for x in node.shares[i]],
                            "time_s": float(node.time[i]),
                            "compute_s": float(node.compute[i]),
                            "comm_s": float(node.comm[i])} for i in range(len(names))],
            })
        out.append({"level": depth, "nodes": entries})
    return out


def scheme_entry(plan: Plan) -> dict[str, Any]:
    """One scheme's prediction: totals, memory, per layer, per level."""
    root, worst = plan.root, plan.root.worst_device
    assert worst is not None
    return {
        "label": plan.scheme.label,
        "balanced_ratio": plan.scheme.balanced,
        "types_allowed": [_TYPE[t] for t in range(3)
                          if plan.scheme.allowed(plan.graph)[:, t].any()],
        "time_s": plan.time_s,
        "compute_s": plan.compute_s,
        "comm_s": plan.comm_s,
        "bytes_per_iteration": root.bytes_moved,
        "memory": {"device": worst.accelerator, "bytes": worst.memory_bytes,
                   "capacity_bytes": worst.memory_capacity,
                   "fraction": worst.memory_fraction, "fits": plan.fits},
        "memory_penalty_s": plan.memory_penalty,
        "layers": [{"layer": node.name, "kind": node.kind,
                    "type": _TYPE[int(root.types[i])],
                    "ratio": [float(x) for x in root.shares[i]],
                    "time_s": float(root.time[i]), "compute_s": float(root.compute[i]),
                    "comm_s": float(root.comm[i])}
                   for i, node in enumerate(plan.graph.nodes)],
        "levels": _levels(plan),
    }


def partition_result(plans: dict[str, Plan], config: dict[str, Any], planning_s: float,
                     execution: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``kind: partition`` result (schema in docs/partition.md)."""
    first = next(iter(plans.values()))
    dp = plans["dp"].time_s
    result = new_result("partition", config)
    result["summary"] = {
        "workload": first.graph.name,
        "devices": first.cluster.spec(),
        "num_devices": first.cluster.size,
        "batch": first.options.batch,
        "hierarchy": first.options.hierarchy,
        "levels": len(first.levels()),
        "partitioned_layers": len(first.graph),
        "speedup_over_dp": {name: dp / plans[name].time_s for name in ("accpar", "hypar", "owt")},
        "ablation_speedup_over_dp": {name: dp / p.time_s for name, p in plans.items()
                                     if name not in HEADLINE},
        "time_s": {name: p.time_s for name, p in plans.items()},
        "fits": {name: p.fits for name, p in plans.items()},
        "planning_time_s": planning_s,
    }
    result["schemes"] = {name: scheme_entry(p) for name, p in plans.items()}
    result["graph"] = {
        "layers": [{"layer": n.name, "kind": n.kind, "c_in": n.c_in, "c_out": n.c_out,
                    "kernel": n.kernel, "params": n.params, "flops": n.flops,
                    "owns": list(n.owns)} for n in first.graph.nodes],
        "edges": [{"from": first.graph.nodes[e.src].name, "to": first.graph.nodes[e.dst].name,
                   "kind": e.kind, "elems_per_sample": e.elems} for e in first.graph.edges],
    }
    if execution is not None:
        result["execution"] = execution
    return result


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def print_partition(result: dict[str, Any], json_path: str | None = None) -> None:
    """The schemes side by side, then AccPar's choices per level."""
    from rich.console import Console
    from rich.table import Table

    s = result["summary"]
    table = Table(title=f"dlcomm partition: {s['workload']} on {s['devices']}, batch "
                        f"{s['batch']}, {s['levels']} level(s)", title_justify="left")
    for col in ("scheme", "time ms", "compute ms", "comm ms", "speedup vs DP",
                "GB moved/iter", "fullest device"):
        table.add_column(col, justify="left" if col == "scheme" else "right")
    dp = result["schemes"]["dp"]["time_s"]
    for name, entry in result["schemes"].items():
        mem = entry["memory"]
        table.add_row(f"{name} ({entry['label']})", _ms(entry["time_s"]),
                      _ms(entry["compute_s"]), _ms(entry["comm_s"]),
                      f"{dp / entry['time_s']:.2f}x", f"{entry['bytes_per_iteration'] / 1e9:.3f}",
                      f"{mem['device']} {mem['fraction']:.0%}" + ("" if mem["fits"] else " (!)"))
    console = Console()
    console.width = max(console.width, 120)
    console.print(table)
    levels = Table(title="AccPar per level (distinct nodes)", title_justify="left")
    for col in ("level", "sides", "count", "I", "II", "III", "ratio of side 1 (min..max)"):
        levels.add_column(col, justify="left" if col == "sides" else "right")
    for level in result["schemes"]["accpar"]["levels"]:
        for node in level["nodes"]:
            kinds = [x["type"] for x in node["layers"]]
            ratios = [x["ratio"][0] for x in node["layers"]]
            levels.add_row(str(level["level"]), " | ".join(node["devices"]), str(node["count"]),
                           *(str(kinds.count(t)) for t in _TYPE),
                           f"{min(ratios):.3f}..{max(ratios):.3f}")
    if json_path:
        levels.caption = f"JSON result: {json_path}"
    console.print(levels)


def plot_partition(result: dict[str, Any], path: str | Path) -> Path:
    """AccPar's type map per level and node, per-layer times and totals of the schemes."""
    from dlcomm.plots import pyplot
    plt = pyplot()
    from matplotlib.colors import ListedColormap

    schemes = result["schemes"]
    accpar = schemes["accpar"]
    layers = [x["layer"] for x in accpar["layers"]]
    rows, labels = [], []
    for level in accpar["levels"]:
        for node in level["nodes"]:
            rows.append([_TYPE.index(x["type"]) for x in node["layers"]])
            labels.append(f"L{level['level']} " + " | ".join(node["devices"]))
    fig = plt.figure(figsize=(13, 4 + 0.22 * len(rows)))
    grid = fig.add_gridspec(2, 3, height_ratios=[max(len(rows), 2) * 0.22 + 0.8, 3])
    ax_map = fig.add_subplot(grid[0, :])
    colors = ListedColormap(["#4c72b0", "#dd8452", "#55a868"])
    ax_map.imshow(np.array(rows), aspect="auto", cmap=colors, vmin=-0.5, vmax=2.5,
                  interpolation="nearest")
    ax_map.set_yticks(range(len(labels)), labels, fontsize=7)
    ax_map.set_xticks([])
    ax_map.set_title("AccPar partition type per layer (blue I: batch, orange II: C_in, "
                     "green III: C_out)", fontsize=9)

    ax_layers = fig.add_subplot(grid[1, :2])
    x = np.arange(len(layers))
    width = 0.8 / len(HEADLINE)
    for k, name in enumerate(HEADLINE):
        ax_layers.bar(x + (k - (len(HEADLINE) - 1) / 2) * width,
                      [e["time_s"] * 1e3 for e in schemes[name]["layers"]], width,
                      label=schemes[name]["label"])
    ax_layers.set_xticks(x, layers, rotation=90, fontsize=5)
    ax_layers.set_ylabel("predicted time per layer (ms)")
    ax_layers.legend(fontsize=7)
    ax_layers.grid(axis="y", alpha=0.3)

    ax_total = fig.add_subplot(grid[1, 2])
    names = list(schemes)
    compute = [schemes[n]["compute_s"] * 1e3 for n in names]
    comm = [schemes[n]["comm_s"] * 1e3 for n in names]
    ax_total.bar(names, compute, label="compute")
    ax_total.bar(names, comm, bottom=compute, label="communication")
    dp = schemes["dp"]["time_s"]
    for i, n in enumerate(names):
        ax_total.text(i, compute[i] + comm[i], f"{dp / schemes[n]['time_s']:.2f}x",
                      ha="center", va="bottom", fontsize=7)
    ax_total.set_ylabel("predicted iteration time (ms)")
    ax_total.tick_params(axis="x", rotation=45, labelsize=7)
    ax_total.legend(fontsize=7)
    s = result["summary"]
    fig.suptitle(f"dlcomm partition: {s['workload']} on {s['devices']}, batch {s['batch']}")
    fig.tight_layout()

    return save_figure(fig, path)


def execution_entry(run: Any, plan: Plan, batch: int) -> dict[str, Any]:
    """The ``execution`` block: what ran, the checks, and per rank measured vs model bytes."""
    bpe = run.bytes_per_element
    ranks = []
    for r, report in enumerate(run.ranks):
        steps = report["steps"]
        model_sent = sum(e[0][r] for e in run.expected.values()) * run.steps * bpe
        model_recv = sum(e[1][r] for e in run.expected.values()) * run.steps * bpe
        ranks.append({
            "rank": r, "device": plan.cluster.accelerator(r).name,
            "slowdown": run.plan.slowdowns[r],
            "bytes_sent": sum(v[0] for v in run.measured[r].values()) * bpe,
            "bytes_received": sum(v[1] for v in run.measured[r].values()) * bpe,
            "model_bytes_sent": model_sent, "model_bytes_received": model_recv,
            "step_s": float(np.mean([x["step_s"] for x in steps])),
            "compute_s": float(np.mean([x["compute_s"] for x in steps])),
            "comm_s": float(np.mean([x["comm_s"] for x in steps])),
        })
    return {
        "scheme": plan.scheme.name, "ranks": len(run.ranks), "steps": run.steps,
        "batch": batch, "dtype": run.dtype, "bytes_per_element": bpe,
        "layers": [{"layer": n.name, "type": _TYPE[t], "split": s}
                   for n, t, s in zip(plan.graph.nodes, run.plan.types, run.plan.splits)],
        "max_grad_error": run.max_grad_error, "grad_scale": run.grad_scale,
        "tolerance": run.tolerance,
        "gradients_match": run.gradients_match, "bytes_match": run.bytes_match,
        "mismatches": run.mismatches()[:10],
        "reference_losses": run.losses,
        "per_rank": ranks,
    }
