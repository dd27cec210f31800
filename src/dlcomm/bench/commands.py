"""``dlcomm bench``: measurements of exchanges, written as JSON (never asserted as tests)."""

from __future__ import annotations

from typing import Any

import click

from dlcomm.options import network_options, split_specs

__all__ = ["bench"]


@click.group()
def bench() -> None:
    """Benchmarks: variants measured side by side in one run, JSON results."""


@bench.command("allreduce")
@click.option("--exchange", "exchanges", default="ring", show_default=True,
              help="Comma-separated exchange specs, measured in one run (e.g. ring,switch).")
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--size", default="100MB", show_default=True, help="Tensor bytes per worker.")
@click.option("--reps", type=int, default=5, show_default=True, help="Timed repetitions.")
@click.option("--warmup", type=int, default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the inputs.")
@click.option("--timeout-s", type=float, default=300.0, show_default=True)
@click.option("--json", "json_path", help="Write the JSON result here.")
@network_options
def bench_allreduce(exchanges: str, workers: int, size: str, reps: int, warmup: int, seed: int,
                    timeout_s: float, json_path: str | None, **net: Any) -> None:
    """Time all-reduces of SIZE bytes per worker through each exchange, with bounds and errors."""
    from dlcomm.bench.allreduce import AllreduceBench
    from dlcomm.bench.run import print_allreduce_table, run_allreduce
    from dlcomm.emulate.network import NetworkOptions
    from dlcomm.registry import parse_size
    from dlcomm.results import check_writable, write_json

    net_opts = NetworkOptions(net["network"] or "loopback", net["bandwidth"],
                              net["topology"] or "star", net["cluster"])
    cfg = AllreduceBench(tuple(split_specs(exchanges)), workers, parse_size(size), reps, warmup,
                         seed, timeout_s)
    check_writable(json_path)
    result = run_allreduce(cfg, net_opts)
    if json_path:
        write_json(json_path, result)
    print_allreduce_table(result, json_path)
