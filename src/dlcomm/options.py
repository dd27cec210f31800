"""Command-line options shared by several commands (kept apart so that command modules can
import them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["network_options", "switch_options"]


def network_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Where a job's workers run: this host's loopback or an emulated cluster."""
    options = [
        click.option("--network", type=click.Choice(["loopback", "emulated"]),
                     help="loopback (default) or emulated: one network namespace per worker "
                          "host, shaped links (needs root)."),
        click.option("--bandwidth", help="Emulated link rate, e.g. 100mbit, 1gbit, 10gbit."),
        click.option("--topology", help="Emulated topology: star (default) or "
                                        "leafspine:RACKS:HOSTS_PER_RACK:OVERSUB."),
        click.option("--cluster", help="Run on a cluster made by `dlcomm cluster up --name`."),
        click.option("--mtu", type=click.IntRange(576, 65535), default=9000, show_default=True,
                     help="MTU of the emulated links (1500: standard Ethernet frames; the "
                          "switch exchange sizes its packets to fit)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def switch_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """How switch exchanges reach the aggregation switch."""
    options = [
        click.option("--switch", help="Use running switches HOST:PORT[,HOST:PORT...] instead "
                                      "of starting one for the job."),
        click.option("--switch-shards", type=click.IntRange(1, 64), default=1,
                     show_default=True, help="Switch processes to start (the tensor is "
                                             "spread over them)."),
        click.option("--drop-rate", type=click.FloatRange(0, 1, max_open=True), default=0.0,
                     show_default=True, help="Inject this packet loss at the switch and the "
                                             "workers, both directions."),
    ]
    for option in reversed(options):
        func = option(func)
    return func
