"""The ``dlcomm`` command's entry point: the command line is imported inside it, so that a
Ctrl-C while the libraries load (torch takes about a second) is one line and exit code 130
like one at any later moment, not a traceback or an abort."""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["main"]


def _interrupted() -> int:
    print("dlcomm: error: interrupted", file=sys.stderr)
    return 130


def _leave(code: int) -> int:
    """An interrupted command (130) leaves by os._exit, its one line written: an interrupt
    raised inside code that torch ran through PyRun_String leaves CPython's "unhandled
    KeyboardInterrupt" flag set even once it was caught, and the interpreter would then end
    itself by SIGINT instead of exiting 130. Its cleanup has run: the finally blocks and
    context managers did as the interrupt unwound."""
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return code


def main() -> int:
    # While the libraries load, a Ctrl-C is noted, not raised: raised inside torch's C++
    # import code it is a C++ exception that ends the process by abort() ("terminate called
    # after throwing pybind11::error_already_set"), or it leaves CPython's "unhandled
    # KeyboardInterrupt" flag set and the interpreter ends itself by SIGINT. The import
    # finishes (a second at most) and the command then ends as interrupted; a second
    # Ctrl-C (an import that hangs) ends it at once. Where SIGINT is ignored (a background
    # job), it stays ignored.
    noted: list[int] = []

    def note(signum: int, _frame: object) -> None:
        noted.append(signum)
        if len(noted) > 1:
            _leave(_interrupted())

    previous = signal.getsignal(signal.SIGINT)
    if previous is None:   # a handler not set from Python: restore Python's own
        previous = signal.default_int_handler
    try:
        if previous is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, note)
        try:
            from dlcomm.cli import main as run
        finally:
            if previous is not signal.SIG_IGN:
                signal.signal(signal.SIGINT, previous)
    except KeyboardInterrupt:   # before the handler was set
        return _leave(_interrupted())
    if noted:
        return _leave(_interrupted())
    return _leave(run())
