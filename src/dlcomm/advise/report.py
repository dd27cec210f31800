"""The advisor's table and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlcomm.plots import pyplot, save_figure

__all__ = ["print_advice", "plot_sweep"]


def _rate(bps: float | None) -> str:
    if bps is None:
        return "never"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps / 1e3:.3g} kbit/s"


def _short(label: str) -> str:
    """``compressed:method=M,over=E`` -> ``M over E`` (the table's narrow column)."""
    if label.startswith("compressed:method="):
        method, _, over = label[len("compressed:method="):].partition(",over=")
        return f"{method} over {over}"
    return label


def print_advice(result: dict[str, Any], console: Any) -> None:
    """The ranked table, the recommendation and, after --verify, the measured figures."""
    from rich.table import Table

    pays = result["sweep"]["pays_bps"]
    verified = {r["candidate"]: r for r in (result.get("verify") or {}).get("rows", [])}
    table = Table(title=f"{result['profile']['name']} on {result['config']['cluster']['workers']}"
                  f" workers at {_rate(result['config']['cluster']['link_bps'])}")
    for col in ("candidate", "iteration", "speedup", "exposed comm", "limited by", "pays at"):
        table.add_column(col, justify="left" if col in ("candidate", "limited by") else "right",
                         overflow="fold")
    if verified:
        table.add_column("measured", justify="right")
    for row in result["predictions"]:
        span = pays.get(row["candidate"])
        cells = [_short(row["candidate"]), f"{row['iteration_s'] * 1e3:.1f} ms",
                 f"{row['speedup_over_ring']:.2f}x", f"{row['exposed_share']:.0%}",
                 row["limiter"], f"{_rate(span[0])} - {_rate(span[1])}" if span else "never"]
        if verified:
            v = verified.get(row["candidate"])
            cells.append(f"{v['measured_s'] * 1e3:.1f} ms ({v['error']:+.0%})" if v else "")
        table.add_row(*cells)
    console.print(table)
    s = result["summary"]
    console.print(f"recommendation: {s['recommendation']} "
                  f"({s['predicted_speedup_over_ring']:.2f}x over the ring predicted; "
                  f"confidence {s['confidence']['level']}: {s['confidence']['meaning']})")
    if result.get("verify"):
        v = result["verify"]
        rec = v.get("recommended_speedup_error")
        runs = f" (medians of {v['repeats']} runs)" if v.get("repeats", 1) > 1 else ""
        rounds = v.get("recommended_speedup_rounds") or []
        spread = f" (round by round {min(rounds):.2f}x-{max(rounds):.2f}x)" \
            if len(rounds) > 1 and v["recommended"] != "ring" else ""
        console.print(f"verified{runs}: measured fastest {v['measured_fastest']}; "
                      f"recommendation {'holds' if v['recommendation_ok'] else 'does not hold'}"
                      + (f", its speedup off by {rec:+.1%}{spread}" if rec is not None else "")
                      + f"; worst speedup error {v['worst_speedup_error']:.0%}")


def plot_sweep(result: dict[str, Any], path: str | Path) -> Path:
    """Predicted speedup over the ring against link rate, per candidate; dots at the ends
    of the range where each pays (5% faster than the ring)."""
    plt = pyplot()
    sweep = result["sweep"]
    rates = [b / 1e9 for b in sweep["link_bps"]]
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, values in sweep["speedup_over_ring"].items():
        line, = ax.plot(rates, values, label=_short(label))
        span = sweep["pays_bps"].get(label)
        if span is not None and label != "ring":  # where it pays: from .. to
            for edge in span:
                ax.plot([edge / 1e9], [values[sweep["link_bps"].index(edge)]], "o",
                        color=line.get_color())
    ax.axvline(result["config"]["cluster"]["link_bps"] / 1e9, color="grey", ls=":",
               label="this cluster")
    ax.set_xscale("log")
    ax.set_xlabel("link rate (Gbit/s)")
    ax.set_ylabel("predicted speedup over ring")
    ax.set_title(f"{result['profile']['name']}, {result['config']['cluster']['workers']} workers")
    ax.legend(fontsize=7)
    return save_figure(fig, path)
