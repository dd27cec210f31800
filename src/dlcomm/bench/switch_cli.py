"""``dlcomm bench switch``: the command line of :mod:`dlcomm.bench.switch_rate`."""

from __future__ import annotations

from typing import Any

import click

from dlcomm.errors import ConfigError

__all__ = ["switch_cmd"]

MAX_SECONDS = 60       # per row; the load generator's C call is not interruptible sooner
MAX_LOAD_WORKERS = 64  # csrc/loadgen.c


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{what} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{what} takes positive integers, got {text!r}")
    return values


@click.command("switch")
@click.option("--workers", default="4,8,16", show_default=True, help="Workers per job.")
@click.option("--payloads", default="1KB,8KB,64KB", show_default=True,
              help="Payload per packet: 1KB (256 elements), 8KB, 64KB.")
@click.option("--threads", default="1,2", show_default=True,
              help="Native packet threads to measure (the Python dataplane has one).")
@click.option("--dataplanes", default="native,python", show_default=True)
@click.option("--seconds", type=float, default=2.0, show_default=True, help="Load per row.")
@click.option("--auth", type=click.Choice(["authenticated", "encrypted", "none"]),
              default="authenticated", show_default=True)
@click.option("--no-gso", is_flag=True, help="One sendmsg per packet in the load generator.")
@click.option("--json", "json_path", help="Write the JSON result here.")
@click.option("--plot", "plot_path", help="Write a plot (PNG) here.")
def switch_cmd(workers: str, payloads: str, threads: str, dataplanes: str, seconds: float,
               auth: str, no_gso: bool, json_path: str | None, plot_path: str | None) -> None:
    """The switch alone under a native load generator: input per core, per thread, rates."""
    from rich.console import Console
    from rich.table import Table

    from dlcomm.bench.switch_rate import PAYLOADS, measure_switch, plot_switch
    from dlcomm.native import load
    from dlcomm.results import check_writable, write_json

    check_writable(json_path)
    check_writable(plot_path, "--plot")
    names = [p.strip() for p in payloads.split(",") if p.strip()]
    if not names or set(names) - set(PAYLOADS):
        raise ConfigError(f"--payloads takes {', '.join(PAYLOADS)}, got {payloads!r}")
    planes = [d.strip() for d in dataplanes.split(",") if d.strip()]
    if not planes or set(planes) - {"native", "python"}:
        raise ConfigError(f"--dataplanes takes native and python, got {dataplanes!r}")
    if not 0 < seconds <= MAX_SECONDS:
        raise ConfigError(f"--seconds must be in (0, {MAX_SECONDS}], got {seconds}")
    counts = _ints(workers, "--workers")
    if max(counts) > MAX_LOAD_WORKERS:
        raise ConfigError(f"--workers: the load generator plays at most {MAX_LOAD_WORKERS} "
                          f"workers, got {max(counts)}")
    load()   # the load generator is native: a clear error if it was not built
    variants = [("native", t) for t in _ints(threads, "--threads") if "native" in planes]
    variants += [("python", 1)] if "python" in planes else []
    console = Console()

    def progress(row: dict[str, Any]) -> None:
        console.print(f"{row['dataplane']} x{row['threads']} n={row['workers']} "
                      f"{row['payload']}: {row['input_gbps']:.2f} Gbit/s in, "
                      f"{row['input_gbps_per_core'] or 0:.2f} per core, "
                      f"{row['packets_per_s']:,} pkt/s")

    result = measure_switch(variants, counts, names, seconds, auth,
                            not no_gso, progress)
    if json_path:
        write_json(json_path, result)
    if plot_path:
        plot_switch(result, plot_path)
    table = Table("dataplane", "n", "payload", "Gbit/s in", "per core", "per thread",
                  "kpkt/s", "switch cores", title="dlcomm bench switch", title_justify="left")
    for r in result["rows"]:
        table.add_row(f"{r['dataplane']} x{r['threads']}", str(r["workers"]), r["payload"],
                      f"{r['input_gbps']:.2f}", f"{r['input_gbps_per_core'] or 0:.2f}",
                      f"{r['input_gbps_per_thread']:.2f}", f"{r['packets_per_s'] / 1e3:.0f}",
                      f"{r['switch_cores_used']:.2f}")
    if json_path:
        table.caption = f"JSON result: {json_path}"
    console.print(table)
