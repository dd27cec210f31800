"""The ``bench-compression`` result read back: its headline numbers (``summary``), the
tables on the console and the plot (docs/compression.md). Pure functions of the result:
nothing here runs a benchmark (that is :mod:`dlcomm.bench.compression`).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plots import save_figure
from dlcomm.registry import parse_spec

__all__ = ["summarize", "print_compression_tables", "plot_compression"]


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing (or zero)."""
    return a / b if a and b else None


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeats of one method as one row: median time to target (a run that never got
    there counts as infinitely slow; None if most never did) and time per step."""
    reached = sorted(r["time_to_target_s"] or math.inf for r in runs)
    target = statistics.median(reached)
    return {"time_to_target_s": target if math.isfinite(target) else None,
            "time_per_step_s": statistics.median(r["time_per_step_s"] for r in runs),
            "runs": len(runs)}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers (docs/compression.md, "must show")."""
    out: dict[str, Any] = {}
    acc = result.get("accuracy") or []
    if acc:
        by: dict[str, list[dict[str, Any]]] = {}
        for r in acc:
            by.setdefault(r["method"], []).append(r)
        base = by.get("none", [])
        mean = {m: statistics.fmean(r["final_accuracy"] for r in rs) for m, rs in by.items()}
        best = {m: statistics.fmean(r["best_accuracy"] for r in rs) for m, rs in by.items()}
        out["accuracy"] = {
            "mean_final_accuracy": mean, "mean_best_accuracy": best,
            "final_points_below_uncompressed": {m: 100 * (mean["none"] - v)
                                                for m, v in mean.items()} if base else None}
    train = result.get("train") or []
    if train:
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for r in train:
            key = f"{parse_spec(r['workload']).name}@{r['bandwidth']}"
            runs.setdefault(key, {}).setdefault(r["method"], []).append(r)
        table = {key: {m: _median_run(rs) for m, rs in methods.items()}
                 for key, methods in runs.items()}
        speed: dict[str, Any] = {}
        for key, rows in table.items():
            none = rows.get("none", {}).get("time_to_target_s")
            fp16 = rows.get("fp16", {}).get("time_to_target_s")
            times = {m: r["time_to_target_s"] for m, r in rows.items()}
            reached = {m: t for m, t in times.items() if t}
            best = min(reached, key=lambda m: reached[m]) if reached else None
            speed[key] = {
                "runs": {m: r["runs"] for m, r in rows.items()},
                "time_to_target_s": times,
                "speedup_over_uncompressed": {m: _ratio(none, t) for m, t in times.items()},
                "speedup_over_fp16": {m: _ratio(fp16, t) for m, t in times.items()},
                "best_method": best,
                "best_speedup_over_uncompressed": _ratio(none, reached.get(best)) if best else None,
                "time_per_step_over_uncompressed": {
                    m: _ratio(r["time_per_step_s"], rows.get("none", {}).get("time_per_step_s"))
                    for m, r in rows.items()}}
        out["time_to_target"] = speed
        fastest = max(r["bandwidth_bps"] for r in train)
        adaptive = {k: v for k, v in speed.items() if "adaptive" in v["time_to_target_s"]
                    and k.endswith(next(r["bandwidth"] for r in train
                                        if r["bandwidth_bps"] == fastest))}
        out["adaptive_at_fastest_rate"] = {
            k: {"time_to_target_over_uncompressed": _ratio(v["time_to_target_s"]["adaptive"],
                                                           v["time_to_target_s"].get("none")),
                "time_per_step_over_uncompressed":
                    v["time_per_step_over_uncompressed"].get("adaptive")}
            for k, v in adaptive.items()}
    emu = result.get("emulate") or []
    if emu:
        out["emulate_speedup_over_uncompressed"] = {
            f"{r['model']}@{r['bandwidth']}": {} for r in emu}
        for r in emu:
            out["emulate_speedup_over_uncompressed"][f"{r['model']}@{r['bandwidth']}"][
                r["method"]] = r["speedup_over_uncompressed"]
    thr = result.get("throughput") or []
    if thr:
        out["throughput_MBps"] = {r["method"]: r["throughput_MBps"] for r in thr}  # None: no work
        out["compression_ratio"] = {r["method"]: r["compression_ratio"] for r in thr}
    return out


def print_compression_tables(result: dict[str, Any], json_path: str | None) -> None:
    """The result's tables on the console: throughput, accuracy, time to target, emulated
    speedups (and where the JSON went)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if result.get("throughput"):
        t = Table("method", "MB/s", "ratio", "ring B/elem", "switch B/elem", "rel. error",
                  "exchange", title="compress + decompress, one CPU thread pool",
                  title_justify="left")
        for r in result["throughput"]:
            sw = r["switch_wire_bytes_per_element"]
            mbps = r["throughput_MBps"]
            t.add_row(r["method"], f"{mbps:.0f}" if mbps else "no work",
                      f"{r['compression_ratio']:.1f}",
                      f"{r['ring_wire_bytes_per_element']:.3f}",
                      f"{sw:.3f}" if sw is not None else "-", f"{r['relative_error']:.3f}",
                      r["aggregation"])
        console.print(t)
    s = result["summary"]
    if "accuracy" in s:
        t = Table("method", "mean final accuracy", "mean best", "points below none",
                  title="accuracy (loopback, seeds averaged)", title_justify="left")
        below = s["accuracy"]["final_points_below_uncompressed"] or {}
        for m, v in s["accuracy"]["mean_final_accuracy"].items():
            t.add_row(m, f"{v:.2%}", f"{s['accuracy']['mean_best_accuracy'][m]:.2%}",
                      f"{below.get(m, 0):+.2f}")
        console.print(t)
    for key, v in (s.get("time_to_target") or {}).items():
        t = Table("method", "time to target", "vs none", "vs fp16", "step time vs none",
                  title=f"time to target: {key}" + (
                      f" (median of {max(v['runs'].values())} runs)"
                      if max(v.get("runs", {"": 1}).values()) > 1 else ""),
                  title_justify="left")
        for m, tt in v["time_to_target_s"].items():
            a, b = v["speedup_over_uncompressed"][m], v["speedup_over_fp16"][m]
            c = v["time_per_step_over_uncompressed"][m]
            t.add_row(m, f"{tt:.1f} s" if tt else "never", f"{a:.2f}x" if a else "-",
                      f"{b:.2f}x" if b else "-", f"{c:.2f}" if c else "-")
        console.print(t)
    for key, v in (s.get("emulate_speedup_over_uncompressed") or {}).items():
        console.print(f"emulated {key}: " + ", ".join(f"{m} {x:.2f}x" for m, x in v.items()))
    if json_path:
        console.print(f"JSON result: {json_path}")


def plot_compression(result: dict[str, Any], path: str | Path) -> Path:
    """Throughput and ratio per method; time to target per rate; emulated speedups."""
    from dlcomm.plots import pyplot
    plt = pyplot()

    panels = [p for p in ("throughput", "train", "emulate") if result.get(p)]
    if not panels:
        raise ConfigError("nothing to plot: the result has no throughput, train or emulate part")
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, part in zip(axes[0], panels):
        if part == "throughput":
            rows = [r for r in result["throughput"] if r["throughput_MBps"]]
            names = [r["method"] for r in rows]
            ax.bar(names, [r["throughput_MBps"] for r in rows], color="C0")
            ax.set_yscale("log")
            ax.set_ylabel("compress + decompress (MB/s)")
            for i, r in enumerate(rows):
                ax.annotate(f"{r['compression_ratio']:.0f}x", (i, r["throughput_MBps"]),
                            ha="center", va="bottom", fontsize=7)
            ax.set_title(f"{rows[0]['size_bytes'] / 1e6:.0f} MB tensor (label: ratio)")
            ax.tick_params(axis="x", rotation=70)
        elif part == "train":
            table = result["summary"]["time_to_target"]
            keys = list(table)
            methods = list(dict.fromkeys(m for v in table.values() for m in v["time_to_target_s"]))
            width = 0.8 / max(len(methods), 1)
            for j, m in enumerate(methods):
                ys = [table[k]["time_to_target_s"].get(m) or 0 for k in keys]
                ax.bar([i + j * width for i in range(len(keys))], ys, width, label=m)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], keys, rotation=15)
            ax.set_ylabel("wall time to target (s); 0 = never")
            ax.legend(fontsize=7)
            ax.set_title("time to target per workload@rate")
        else:
            rows = result["emulate"]
            labels = [f"{r['model']}\n{r['method']}" for r in rows]
            ax.bar(range(len(rows)), [r["speedup_over_uncompressed"] for r in rows], color="C2")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xticks(range(len(rows)), labels, rotation=70, fontsize=7)
            ax.set_ylabel("iteration speedup over uncompressed")
            ax.set_title(f"time-dilated emulation at {rows[0]['bandwidth']}")
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return save_figure(fig, path)
