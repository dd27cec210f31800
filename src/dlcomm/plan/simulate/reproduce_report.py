"""Tables and plots of the reproductions against measured clusters (Megatron-LM, nccl-tests)."""

from __future__ import annotations

from typing import Any

__all__ = ["print_measured", "plot_reproduction", "PLOTTED"]

PLOTTED = ("megatron", "nccl", "hammingmesh-paper")


def print_measured(result: dict[str, Any], json_path: str | None) -> None:
    """The megatron or nccl reproduction as a table, error per row."""
    from rich.console import Console
    from rich.table import Table

    which = result["config"]["reproduction"]
    if which == "hammingmesh-paper":
        table = Table("over", "workload", *[c for c in ("Hx4Mesh", "paper", "error",
                                                        "Hx2Mesh", "paper ", "error ")],
                      title="HammingMesh Fig. 16: relative cost saving (network cost x "
                      "communication overhead)", title_justify="left")
        cells = {(c["hxmesh"], c["baseline"], c["workload"]): c for c in result["cells"]}
        for (hx, base, w), c in cells.items():
            if hx != "hx4":
                continue
            c2 = cells[("hx2", base, w)]
            table.add_row(base, w, f"{c['saving']:.2f}x", f"{c['paper']:.2f}x",
                          f"{c['error']:+.0%}", f"{c2['saving']:.2f}x", f"{c2['paper']:.2f}x",
                          f"{c2['error']:+.0%}")
        table.caption = result["summary"]["published"] + (f"; JSON: {json_path}"
                                                          if json_path else "")
        Console().print(table)
        return
    if which == "megatron":
        table = Table("params", "t x p x d", "v", "GPUs", "batch", "iteration", "bubble",
                      "exposed comm", "TF/s predicted", "published", "error",
                      title="Megatron-LM on Selene (A100 80GB): simulated against published",
                      title_justify="left")
        for r in result["rows"]:
            row = r["row"]
            table.add_row(f"{row['params_b']:g}B ({row['source']})",
                          f"{row['tp']}x{row['pp']}x{r['dp']}", str(row["chunks"]),
                          str(row["gpus"]), str(row["batch"]), f"{r['iteration_s']:.2f} s",
                          f"{r['bubble_s']:.2f} s", f"{r['exposed_comm_s']:.2f} s",
                          f"{r['predicted_tflops']:.1f}", f"{row['published_tflops']:g}",
                          f"{r['error']:+.1%}")
    else:
        table = Table("system", "bytes", "algorithm", "busbw simulated", "published", "error",
                      title="All-reduce bus bandwidth: simulated against nccl-tests",
                      title_justify="left")
        for r in result["rows"]:
            note = "" if r["modelled"] else " (not modelled)"
            table.add_row(r["label"], f"{r['nbytes'] / 1e9:g} GB", r["algorithm"],
                          f"{r['busbw_GBps']:.0f} GB/s", f"{r['published_GBps']:g} GB/s",
                          f"{r['error']:+.1%}{note}")
    s = result["summary"]
    table.caption = (f"{s['within_10pct']} of {s.get('modelled_cases', s.get('rows'))} within "
                     f"10%; {s['published']}" + (f"; JSON: {json_path}" if json_path else ""))
    Console().print(table)


def plot_reproduction(result: dict[str, Any], path: str) -> None:
    """Predicted against published, one bar pair per row, the error written above."""
    from dlcomm.plots import pyplot, save_figure

    plt = pyplot()
    which = result["config"]["reproduction"]
    rows = result["rows"]
    if which == "hammingmesh-paper":
        rows = [c for c in result["cells"] if c["hxmesh"] == "hx4"]
        labels = [f"{c['baseline']}\n{c['workload']}" for c in rows]
        pred = [c["saving"] for c in rows]
        pub = [c["paper"] for c in rows]
        unit, title = "Hx4Mesh's relative cost saving (x)", "HammingMesh Fig. 16: dlcomm vs paper"
    elif which == "megatron":
        labels = [f"{r['row']['params_b']:g}B\n{r['row']['gpus']}" for r in rows]
        pred = [r["predicted_tflops"] for r in rows]
        pub = [r["row"]["published_tflops"] for r in rows]
        unit, title = "TF/s per GPU", "Megatron-LM (SC'21) on A100: simulated vs published"
    else:
        labels = [r["label"].replace(", ", "\n") for r in rows]
        pred = [r["busbw_GBps"] for r in rows]
        pub = [r["published_GBps"] for r in rows]
        unit, title = "all-reduce bus bandwidth (GB/s)", "nccl-tests: simulated vs published"
    fig, ax = plt.subplots(figsize=(max(7.0, 0.8 * len(rows)), 4.8))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], pub, 0.4, label="published")
    ax.bar([x + 0.2 for x in xs], pred, 0.4, label="dlcomm simulate")
    for x, p, q in zip(xs, pub, pred):
        ax.annotate(f"{q / p - 1:+.0%}", (x + 0.2, q), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
