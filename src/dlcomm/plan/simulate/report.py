"""Tables and plots of simulation results; they read only the result JSON."""

from __future__ import annotations

from typing import Any

__all__ = ["print_simulation", "plot_simulation", "print_validation", "print_packet",
           "print_reproduction"]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.1f} ms"


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def print_simulation(result: dict[str, Any], json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if "stages" in result:
        s = result["summary"]
        r = result["resolved"]
        par = r["parallelism"]
        table = Table("iteration", "compute", "bubble", "exposed comm", "comm share",
                      "samples/s", "simulated in",
                      title=f"{r['workload']} on {s['accelerators']} accelerators of "
                      f"{r['topology']['name']} (DP {par['dp']} x PP {par['pp']} x TP "
                      f"{par['tp']}, {s['exchange']})", title_justify="left")
        table.add_row(_ms(s["iteration_s"]), _ms(s["compute_s"]), _ms(s["bubble_s"]),
                      _ms(s["exposed_comm_s"]), f"{s['comm_share']:.1%}",
                      f"{s['samples_per_s']:,.1f}", f"{s['simulate_s']:.2f} s")
        console.print(table)
        stages = Table("stage", "compute", "blocking comm", "idle", "gradient tail", "end",
                       title="pipeline stages", title_justify="left")
        for st in result["stages"]:
            stages.add_row(str(st["stage"]), _ms(st["compute_s"]),
                           _ms(sum(st["blocking_comm_s"].values())), _ms(st["idle_s"]),
                           _ms(st["gradient_tail_s"]), _ms(st["end_s"]))
        console.print(stages)
        coll = Table("dim", "op", "algorithm", "size", "calls/iter", "alone", "rate",
                     "hops", title="collectives (per call, alone on the network)",
                     title_justify="left")
        for c in result["collectives"][:24]:
            rate = min((p["rate_gbps"] for p in c["patterns"]), default=None)
            hops = max((p["hops"] for p in c["patterns"]), default=0)
            coll.add_row(c["dim"], c["op"], c["algorithm"], _size(c["nbytes"]),
                         str(c["calls_per_iteration"]), _ms(c["alone_s"]),
                         f"{rate:,.1f} Gb/s" if rate else "-", str(hops))
        if json_path:
            coll.caption = f"JSON result: {json_path}"
        console.print(coll)
        return
    speed = {(c["accelerators_requested"], c["topology"]): c for c in result["comparisons"]}
    table = Table("N", "topology", "exchange", "iteration", "exposed comm", "comm share",
                  "speedup", title="simulations", title_justify="left")
    for run in result["runs"]:
        cmp = speed.get((run["accelerators_requested"], run["topology"]))
        if not run["available"]:
            table.add_row(str(run["accelerators_requested"]), run["topology"], run["exchange"],
                          "unavailable", "-", "-", "-")
            continue
        sp = cmp["speedup"].get(run["exchange"]) if cmp else None
        table.add_row(str(run["accelerators"]), run["topology_name"], run["exchange_label"],
                      _ms(run["iteration_s"]), _ms(run["exposed_comm_s"]),
                      f"{run['comm_share']:.1%}", f"{sp:.2f}x" if sp else "-")
    if json_path:
        table.caption = f"JSON result: {json_path}"
    console.print(table)


def plot_simulation(result: dict[str, Any], path: str) -> None:
    """Sweeps: iteration time and communication share against N, one line per topology and
    exchange. Otherwise: each run's iteration split into compute, bubble, exposed comm."""
    from dlcomm.plots import pyplot, save_figure

    plt = pyplot()

    runs = [r for r in result["runs"] if r["available"]]
    if result["config"].get("sweep_accelerators"):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.2))
        lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in runs:
            lines.setdefault((r["topology"], r["exchange"]), []).append(r)
        for (topo, _exchange), rows in lines.items():
            xs = [r["accelerators"] for r in rows]
            label = f"{topo}, {rows[0]['exchange_label']}"
            ax1.plot(xs, [r["iteration_s"] for r in rows], marker="o", label=label)
            ax2.plot(xs, [100 * r["comm_share"] for r in rows], marker="o", label=label)
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("accelerators")
            ax.grid(alpha=0.3)
        ax1.set_ylabel("iteration time (s)")
        ax2.set_ylabel("exposed communication (% of iteration)")
        handles, labels = ax1.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
        fig.suptitle(f"{result['config']['workload']}: simulated iteration")
        fig.tight_layout(rect=(0, 0.04 * (1 + len(labels) // 3), 1, 1))
        save_figure(fig, path)
        return
    else:
        fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(runs) + 2), 4.2))
        labels = [f"{r['topology_name']}\n{r['exchange_label']}" for r in runs]
        bottom = [0.0] * len(runs)
        for key, name in (("compute_s", "compute"), ("bubble_s", "pipeline bubble"),
                          ("exposed_comm_s", "exposed communication")):
            vals = [r[key] for r in runs]
            ax.bar(labels, vals, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("seconds per iteration")
        ax.legend(fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        fig.suptitle(f"{result['config']['workload']}: simulated iteration")
    fig.tight_layout()
    save_figure(fig, path)


def print_validation(result: dict[str, Any], json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("workload", "workers", "exchange", "K", "measured", "simulated", "error",
                  "ideal network", title="simulator vs emulator (real scale)",
                  title_justify="left")
    for c in result["cases"]:
        table.add_row(c["workload"], str(c["workers"]), c["exchange"], f"{c['dilation']:g}",
                      _ms(c["measured_s"]), _ms(c["simulated_s"]), f"{c['error']:+.1%}",
                      f"{c['ideal_error']:+.1%}")
    s = result["summary"]
    table.caption = (f"max |error| {s['max_abs_error']:.1%}, mean {s['mean_abs_error']:.1%}"
                     + (f"; JSON result: {json_path}" if json_path else ""))
    Console().print(table)


def print_packet(result: dict[str, Any], json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    r = result["check"]
    table = Table("fake network (virtual)", "flow model S/B", "error", "packet model", "error",
                  "max |sum error|", title=f"in-network aggregation of {_size(r['size_bytes'])} "
                  f"over {r['workers']} workers, k={r['k']}, window {r['window']}",
                  title_justify="left")
    table.add_row(_ms(r["virtual_s"]), _ms(r["flow_model_s"]), f"{r['flow_model_error']:+.1%}",
                  _ms(r["packet_model"]["time_s"]), f"{r['packet_model_error']:+.1%}",
                  f"{r['max_abs_error_vs_float64']:.2e}")
    if json_path:
        table.caption = f"JSON result: {json_path}"
    Console().print(table)


def print_reproduction(result: dict[str, Any], json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    which = result["config"]["reproduction"]
    if which in ("megatron", "nccl", "hammingmesh-paper"):
        from dlcomm.plan.simulate.reproduce_report import print_measured
        print_measured(result, json_path)
        return
    if which == "switchml":
        table = Table("model", "workers", "link", "ring", "switch", "speedup",
                      title="SwitchML-style speedup of in-network aggregation over a ring",
                      title_justify="left")
        for r in result["rows"]:
            table.add_row(r["model"], str(r["workers"]), f"{r['rate_gbps']:g} Gb/s",
                          _ms(r["ring_s"]), _ms(r["switch_s"]), f"{r['speedup']:.2f}x")
    else:
        workloads = result["config"]["workloads"]
        table = Table("topology", "$/accel", *[f"{w} iteration" for w in workloads],
                      *[f"{w} exposed comm" for w in workloads],
                      *[f"{w} perf/$ vs FT" for w in workloads],
                      title=f"HammingMesh vs fat trees at ~{result['config']['accelerators']} "
                      "accelerators", title_justify="left")
        for r in result["rows"]:
            table.add_row(r["name"], f"{r['cost_per_accel_usd']:,.0f}",
                          *[_ms(r[w]["iteration_s"]) for w in workloads],
                          *[_ms(r[w]["exposed_comm_s"]) for w in workloads],
                          *[f"{r[w]['perf_per_dollar_vs_fattree']:.2f}" for w in workloads])
    table.caption = result["summary"]["published"] + (f"; JSON: {json_path}" if json_path else "")
    Console().print(table)
