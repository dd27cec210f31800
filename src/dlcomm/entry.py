"""The ``dlcomm`` command's entry point: the command line is imported inside it, so that a
Ctrl-C while the libraries load (torch takes about a second) is one line and exit code 130
like one at any later moment, not a traceback."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> int:
    try:
        from dlcomm.cli import main as run
    except KeyboardInterrupt:
        print("dlcomm: error: interrupted", file=sys.stderr)
        return 130
    return run()
