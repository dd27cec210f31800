"""The terminal view of ``dlcomm topo show``: counts, cost and bandwidth of one topology."""

from __future__ import annotations

from typing import Any

__all__ = ["print_show"]


def print_show(result: dict[str, Any], json_path: str | None = None) -> None:
    """Three small rich tables read from the ``topo-show`` result."""
    from rich.console import Console
    from rich.table import Table

    topo = result["topology"]
    counts, cost, bw = topo["counts"], topo["cost"], topo["bandwidth"]
    console = Console()
    parts = Table(title=f"{topo['name']} ({topo['spec']}): {topo['accelerators']:,} "
                        "accelerators", title_justify="left")
    parts.add_column("part")
    parts.add_column("count", justify="right")
    parts.add_column("unit", justify="right")
    parts.add_column("cost", justify="right")
    for group in counts["switches"]:
        parts.add_row(f"switch: {group['role']} (level {group['level']}, radix "
                      f"{group['radix']})", f"{group['count']:,}",
                      f"{group['ports_used']:,} ports used", "")
    labels = {"switch_port": "switch ports used", "dac": "DAC cables (electrical, short)",
              "aoc": "AOC cables (optical, long)", "nic_port": "NIC ports (cabled)",
              "board_trace": "board trace links"}
    for key, item in cost["items"].items():
        parts.add_row(labels[key], f"{item['count']:,}", f"${item['unit_usd']:,.0f}",
                      f"${item['usd']:,.0f}")
    parts.add_row("total", "", f"${cost['per_accelerator_usd']:,.0f}/accel",
                  f"${cost['total_usd']:,.0f}")
    console.print(parts)
    frac = counts["switched_ports"] / counts["accelerator_ports"]
    long = counts["long_cable_ports"] / counts["accelerator_ports"]
    metrics = Table(title="bandwidth (Gb/s, one direction)", title_justify="left")
    metrics.add_column("metric")
    metrics.add_column("value", justify="right")
    rows = [("accelerator ports on switches / on long cables", f"{frac:.3f} / {long:.3f}"),
            ("injection per accelerator", f"{bw['injection_gbps']:,.0f}"),
            ("bisection (closed form, total)", f"{bw['bisection_gbps']:,.0f}"),
            ("all-to-all per accelerator (flow model)", f"{bw['alltoall_gbps_per_accel']:,.1f}"),
            ("all-to-all cut bound min(injection, 4B/N)",
             f"{bw['alltoall_bound_gbps_per_accel']:,.1f}"),
            ("random permutation per accelerator (mean / min)",
             f"{bw['permutation_gbps_per_accel']:,.1f} / {bw['permutation_min_gbps']:,.1f}"),
            (f"all-reduce bus bandwidth ({bw['allreduce_algorithm']}, "
             f"{result['config']['allreduce_bytes'] / 1e6:,.0f} MB)",
             f"{bw['allreduce_gbps_per_accel']:,.0f}")]
    if "mincut_gbps" in topo:
        rows.insert(3, ("bisection (max-flow min-cut, per-switch graph)",
                        f"{topo['mincut_gbps']:,.0f}"))
    for label, value in rows:
        metrics.add_row(label, value)
    if json_path:
        metrics.caption = f"JSON result: {json_path}"
    console.print(metrics)
