"""``dlcomm workloads``: the trainable workloads and the layer tables of big models."""

from __future__ import annotations

import click

__all__ = ["workloads"]


@click.group()
def workloads() -> None:
    """The workload catalog: trainable workloads and layer tables of big models."""


@workloads.command("list")
def workloads_list() -> None:
    """List the trainable workloads and the big-model layer tables."""
    from rich.console import Console
    from rich.table import Table

    from dlcomm.workloads import WORKLOADS

    table = Table("name", "description", title="trainable workloads", title_justify="left")
    for name in WORKLOADS:
        table.add_row(name, WORKLOADS.doc(name))
    Console().print(table)
