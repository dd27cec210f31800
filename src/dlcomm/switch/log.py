"""The switch's log: one line for the first event of each kind, later ones only counted.

A log that cannot be written (a full disk, a pipe whose reader left, a closed stream) is
no reason to stop serving: the line is lost, the counter still counts.
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["say", "say_once"]


def say(line: str) -> None:
    """One line to the switch's log, if it can be written."""
    with contextlib.suppress(OSError, ValueError):  # ValueError: the stream was closed
        print(f"dlcomm switch: {line}", file=sys.stderr, flush=True)


def say_once(said: set[str], counter: str, detail: str) -> None:
    """Log ``detail`` unless an event counted as ``counter`` was logged before."""
    if counter not in said:
        said.add(counter)
        say(f"{detail} (counted as {counter}; later ones are only counted)")
