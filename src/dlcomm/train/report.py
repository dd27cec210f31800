"""Turn the workers' reports into the run's JSON result, its table and its plot."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlcomm.errors import DlcommError
from dlcomm.plots import save_figure
from dlcomm.results import new_result
from dlcomm.train.common import WorkerReport
from dlcomm.train.config import TrainConfig
from dlcomm.workloads import Workload

__all__ = ["train_result", "print_train_table", "plot_train", "print_comparison",
           "median_step_time"]


def median_step_time(steps: Sequence[dict[str, Any]], warmup: int) -> float:
    """The median time of a run's steps after the first ``warmup`` (all if fewer)."""
    times = [s["step_time_s"] for s in steps[warmup:]] or [s["step_time_s"] for s in steps]
    if not times:
        raise DlcommError("a training run recorded no steps")
    return float(statistics.median(times))


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def train_result(cfg: TrainConfig, workload: Workload, reports: list[WorkerReport],
                 wall_time_s: float) -> dict[str, Any]:
    """The ``kind: train`` result (schema in docs/results.md)."""
    reports = sorted(reports, key=lambda r: r.rank)
    per_worker = [r.summary() for r in reports]
    steps = len(reports[0].steps)
    final = reports[0].evals[-1] if reports[0].evals else {}
    sent = _mean([w["bytes_sent"] for w in per_worker])
    received = _mean([w["bytes_received"] for w in per_worker])
    summary: dict[str, Any] = {
        "final_loss": final.get("loss"),
        "final_train_loss": _mean([s.loss for s in reports[0].steps[-10:]]),
        "steps": steps,
        "time_per_step_s": _mean([w["time_per_step_s"] for w in per_worker]),
        "comm_wait_per_step_s": _mean([w["comm_wait_per_step_s"] for w in per_worker]),
        "bytes_sent_per_worker": sent,
        "bytes_received_per_worker": received,
        "bytes_sent_per_worker_per_step": sent / max(steps, 1),
        "bytes_received_per_worker_per_step": received / max(steps, 1),
        "bytes_counting": reports[0].exchange.get("counting", "modelled"),
        "gradient_bytes": workload.gradient_bytes,
        "parameters": workload.num_parameters,
        "workers": len(reports),
        "wall_time_s": wall_time_s,
        "block_density": _mean([s.block_density for s in reports[0].steps]),
    }
    wires = [w["wire"] for w in per_worker if w.get("wire")]
    if len(wires) == len(per_worker):
        summary["wire_bytes_sent_per_worker"] = _mean([w["tx_bytes"] for w in wires])
        summary["wire_bytes_received_per_worker"] = _mean([w["rx_bytes"] for w in wires])
    if "accuracy" in final and workload.metric == "accuracy":
        summary["final_accuracy"] = final["accuracy"]
    if "perplexity" in final:
        summary["final_perplexity"] = final["perplexity"]
        summary["final_token_accuracy"] = final.get("accuracy")
    result = new_result("train", cfg.to_dict())
    result["config"]["workload_facts"] = workload.facts or {}
    run_summary = getattr(reports[0], "run_summary", None)  # decentralized sync (train/sync)
    if run_summary is not None:
        summary["sync"] = run_summary(reports)
    result["summary"] = summary
    result["steps"] = [dataclasses.asdict(s) for s in reports[0].steps]
    result["evals"] = reports[0].evals
    result["workers"] = per_worker
    return result


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    return str(n)


def print_train_table(result: dict[str, Any], json_path: str | None = None) -> None:
    """Print the run's summary as a table on stdout."""
    from rich.console import Console
    from rich.table import Table

    s, c = result["summary"], result["config"]
    table = Table(title=f"dlcomm train: {c['workload']} on {s['workers']} workers, "
                        f"exchange {c['exchange']}", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("final accuracy", s.get("final_accuracy"), "{:.2%}"),
            ("final perplexity", s.get("final_perplexity"), "{:.2f}"),
            ("final test loss", s.get("final_loss"), "{:.4f}"),
            ("steps", s["steps"], "{}"),
            ("time per step", s["time_per_step_s"] * 1e3, "{:.1f} ms"),
            ("comm wait per step", s["comm_wait_per_step_s"] * 1e3, "{:.1f} ms"),
            ("gradient size", s["gradient_bytes"], None),
            (f"sent per worker per step ({s['bytes_counting']})",
             s["bytes_sent_per_worker_per_step"], None),
            (f"received per worker per step ({s['bytes_counting']})",
             s["bytes_received_per_worker_per_step"], None),
            ("wire bytes sent per worker per step (interface)",
             s["wire_bytes_sent_per_worker"] / max(s["steps"], 1)
             if "wire_bytes_sent_per_worker" in s else None, None),
            ("wall time", s["wall_time_s"], "{:.1f} s")]
    for label, value, fmt in rows:
        if value is None:
            continue
        table.add_row(label, _fmt_bytes(value) if fmt is None else fmt.format(value))
    if json_path:
        table.caption = f"JSON result: {json_path}"
    Console().print(table)


def plot_train(results: list[dict[str, Any]], path: str | Path) -> Path:
    """Loss over steps and the headline metric over wall time, one line per result."""
    from dlcomm.plots import pyplot
    plt = pyplot()

    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(11, 4))
    for i, res in enumerate(results):
        color = f"C{i}"
        label = f"{run_label(res)} x{res['summary']['workers']}"
        steps = res["steps"]
        losses = [s["loss"] for s in steps]
        window = max(1, len(losses) // 50)
        smooth = [statistics.fmean(losses[max(0, j - window + 1): j + 1])
                  for j in range(len(losses))]
        ax_loss.plot([s["step"] for s in steps], smooth, lw=1, color=color, alpha=0.6,
                     label=f"{label} train (mean of {window})")
        evals = res["evals"]
        metric = "accuracy" if "final_accuracy" in res["summary"] else (
            "perplexity" if "final_perplexity" in res["summary"] else "loss")
        ax_loss.plot([e["step"] for e in evals], [e["loss"] for e in evals], "o-", ms=3,
                     color=color, label=f"{label} test")
        ax_metric.plot([e["time_s"] for e in evals], [e[metric] for e in evals], "o-", ms=3,
                       color=color, label=label)
        ax_metric.set_ylabel(f"test {metric}")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.set_yscale("log")
    ax_metric.set_xlabel("wall time (s)")
    for ax in (ax_loss, ax_metric):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    first = results[0]["config"]
    fig.suptitle(f"dlcomm train: {first['workload']}")
    fig.tight_layout()

    return save_figure(fig, path)


def run_label(result: dict[str, Any]) -> str:
    """The exchange a run asked for (without addresses dlcomm filled in)."""
    extra = result["config"].get("extra") or {}
    return str(extra.get("exchange_requested") or result["config"]["exchange"])


def print_comparison(results: list[dict[str, Any]], names: list[str]) -> None:
    """Train results side by side; speedups are relative to the first result."""
    from rich.console import Console
    from rich.table import Table

    base = results[0]["summary"]
    table = Table("", *names, title=f"dlcomm compare: {results[0]['config']['workload']} "
                  f"on {base['workers']} workers", title_justify="left")
    network = [(r["config"].get("extra") or {}).get("network_info", {}) for r in results]
    table.add_row("network", *[f"{n.get('network', 'loopback')}" + (
        f" {n['rate_bps'] / 1e6:g} Mbit/s" if n.get("rate_bps") else "") for n in network])
    rows = [("final accuracy", "final_accuracy", "{:.2%}"),
            ("final perplexity", "final_perplexity", "{:.2f}"),
            ("time per step", "time_per_step_s", "ms"),
            ("comm wait per step", "comm_wait_per_step_s", "ms"),
            ("sent per worker per step", "bytes_sent_per_worker_per_step", "bytes"),
            ("wire bytes sent per worker", "wire_bytes_sent_per_worker", "bytes"),
            ("wall time", "wall_time_s", "{:.1f} s")]
    for label, key, fmt in rows:
        values = [r["summary"].get(key) for r in results]
        if all(v is None for v in values):
            continue
        cells = []
        for v in values:
            if v is None:
                cells.append("-")
            elif fmt == "ms":
                cells.append(f"{v * 1e3:.1f} ms")
            elif fmt == "bytes":
                cells.append(_fmt_bytes(v))
            else:
                cells.append(fmt.format(v))
        table.add_row(label, *cells)
    base_step = base["time_per_step_s"]
    table.add_row("speedup per step",
                  *[f"{base_step / r['summary']['time_per_step_s']:.2f}x" for r in results])
    Console().print(table)
