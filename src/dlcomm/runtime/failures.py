"""A worker's failure report: one line of cause, written once, read by its launcher.

A worker started by a dlcomm launcher finds ``$DLCOMM_ERROR_FILE`` set. The first failure
it reports (:func:`report_failure`, called where an exception is caught, *before* the
worker closes its sockets, so that the report precedes what its peers see) is kept: later
reports of the same worker (the same exception reaching the top) do not overwrite it. The
report says whether the cause is the worker's own (its code raised) or a peer's (a
collective or an exchange failed because another process died, hung or left), so that the
launcher can name the root cause of a job's failure (:mod:`.launcher`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from dlcomm.errors import DlcommError, ExchangeError

__all__ = ["ERROR_FILE_VAR", "Report", "describe_failure", "is_peer_failure",
           "report_failure", "read_report"]

ERROR_FILE_VAR = "DLCOMM_ERROR_FILE"  # where a failing worker writes its one-line cause


@dataclass(frozen=True)
class Report:
    cause: str        # one line
    peer: bool        # the failure came from another process (a collective, the switch)
    time: float       # when it was reported (time.time())


def describe_failure(exc: BaseException) -> str:
    """The one-line cause of ``exc``: its message for dlcomm's errors, else its type,
    message and where it was raised."""
    if isinstance(exc, DlcommError):
        return str(exc).replace("\n", " ")
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {Path(frame[0].filename).name}:{frame[0].lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}".replace("\n", " ")


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says that another process failed (not this worker's own error):
    an exchange that could not complete, or a torch.distributed/gloo collective that lost
    or timed out on a peer."""
    if isinstance(exc, ExchangeError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}:
        return True
    return isinstance(exc, RuntimeError) and "gloo" in str(exc)


def report_failure(exc: BaseException) -> str:
    """Write the cause of ``exc`` to ``$DLCOMM_ERROR_FILE`` unless this worker reported a
    failure already; returns the cause."""
    cause = describe_failure(exc)
    path = os.environ.get(ERROR_FILE_VAR)
    if path:
        line = json.dumps({"cause": cause, "peer": is_peer_failure(exc), "time": time.time()})
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(line + "\n")
    return cause


def read_report(path: Path) -> Report | None:
    """The report in ``path``, or None if there is none (yet, or a half-written one)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if not text.endswith("\n"):
        return None  # still being written: look again at the next poll
    try:
        doc = json.loads(text)
        return Report(str(doc["cause"]), bool(doc["peer"]), float(doc["time"]))
    except (ValueError, KeyError, TypeError):
        return Report(text.strip().splitlines()[0] if text.strip() else "", False,
                      path.stat().st_mtime)
