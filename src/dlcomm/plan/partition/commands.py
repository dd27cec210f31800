"""``dlcomm partition``: plan tensor partitioning over heterogeneous accelerators."""

from __future__ import annotations

import click

__all__ = ["partition"]


@click.command()
def partition() -> None:
    """Plan per-layer tensor partitioning over heterogeneous accelerators (AccPar)."""
    raise click.ClickException("the partition planner is being built")
