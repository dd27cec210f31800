"""The ``dlcomm`` command's entry point: the command line is imported inside it, so that a
Ctrl-C while the libraries load (torch takes about a second) is one line and exit code 130
like one at any later moment, not a traceback."""

from __future__ import annotations

import os
import sys

__all__ = ["main"]


def main() -> int:
    try:
        from dlcomm.cli import main as run
    except KeyboardInterrupt:
        print("dlcomm: error: interrupted", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # not a return: an interrupt inside code that a library ran through PyRun_String
        # (torch does, while it loads) leaves CPython's "unhandled KeyboardInterrupt" flag
        # set, and the interpreter would then end itself by SIGINT instead of exiting 130.
        # Nothing was started yet that needs cleaning up.
        os._exit(130)
    return run()
