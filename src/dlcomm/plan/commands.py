"""``dlcomm topo``: topologies, their cost and bandwidth for deep-learning traffic."""

from __future__ import annotations

import click

__all__ = ["topo"]


@click.group()
def topo() -> None:
    """Network topologies for deep learning: counts, cost, bandwidth, comparison."""
