"""``dlcomm bench fuzz``: the command (the campaign is :mod:`dlcomm.bench.fuzz`)."""

from __future__ import annotations

from typing import Any

import click

__all__ = ["fuzz_cmd", "print_fuzz_summary"]


@click.command("fuzz")
@click.option("--datagrams", type=int, default=1_000_000, show_default=True,
              help="Mutated, forged and random datagrams to send the switch.")
@click.option("--control-lines", type=int, default=100_000, show_default=True,
              help="Hostile control lines to send over TLS.")
@click.option("--workers", type=int, default=4, show_default=True,
              help="Ranks of the honest job that all-reduces meanwhile.")
@click.option("--size", default="4MB", show_default=True,
              help="The honest job's tensor bytes per worker.")
@click.option("--reps", type=int, default=40, show_default=True,
              help="Repetitions per honest run (each hashed by every rank).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--timeout-s", type=float, default=3600.0, show_default=True)
@click.option("--json", "json_path", help="Write the JSON result here.")
def fuzz_cmd(datagrams: int, control_lines: int, workers: int, size: str, reps: int,
             seed: int, timeout_s: float, json_path: str | None) -> None:
    """Attack a live switch on loopback while an honest job all-reduces through it."""
    from dlcomm.bench.fuzz import FuzzBench, run_fuzz
    from dlcomm.registry import parse_size
    from dlcomm.results import check_writable, write_json

    cfg = FuzzBench(datagrams, control_lines, workers, parse_size(size), reps, seed,
                    timeout_s)
    check_writable(json_path)
    result = run_fuzz(cfg, progress=lambda msg: click.echo(msg, err=True))
    if json_path:
        write_json(json_path, result)
    print_fuzz_summary(result, json_path)


def print_fuzz_summary(result: dict[str, Any], json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    s = result["summary"]
    rss = (f"{s['rss_kib_before'] / 1024:.1f} -> {s['rss_kib_after'] / 1024:.1f} MiB"
           if s["rss_kib_after"] is not None else "-")
    table = Table("", "", title="fuzz campaign against a live switch", title_justify="left")
    for name, value in (
            ("switch alive", "yes" if s["switch_alive"] else "NO"),
            ("datagrams sent / seen by the switch",
             f"{s['datagrams_sent']:,} / {s['switch_packets_in']:,}"),
            ("control lines sent / answered",
             f"{s['control_lines_sent']:,} / {s['control_replies']:,}"),
            ("amplification (packets, bytes)",
             f"{s['amplification_packets']:.3f}, {s['amplification_bytes']:.3f}"),
            ("switch RSS", rss),
            ("honest runs (failed)", f"{s['honest_runs']} ({s['honest_runs_failed']})"),
            ("checksums identical to the unattacked run",
             "yes" if s["checksums_identical"] else "NO"),
            ("attacker's rounds completed", f"{s['attacker_completions']:,}"),
            ("switch errors", str(s["switch_errors"]))):
        table.add_row(name, value)
    if json_path:
        table.caption = f"JSON result: {json_path}"
    Console().print(table)
