"""Job directories under $TMPDIR that never outlive their owner for long.

Every launcher keeps a job's files (its config, the workers' error reports and logs, a
switch's counters) in a directory named ``dlcomm-KIND-PID-START-<random>``: the owner's pid
and start time (in whole seconds since the epoch). It is removed when the job ends; when
the owner was killed (SIGKILL leaves no time to clean up) the next job of any kind removes
it (:func:`collect_stale`): a directory whose owner no longer runs (no process with that
pid, or one started at another time) is stale.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil

__all__ = ["job_directory", "collect_stale", "owner_alive"]

_NAME = re.compile(r"^dlcomm-[a-z0-9-]+?-(\d+)-(\d+)-[^-]+$")


def _start_of(pid: int) -> int | None:
    try:
        return int(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def owner_alive(pid: int, start: int) -> bool:
    """Whether the process that made a directory (``pid`` started at ``start``) still runs."""
    actual = _start_of(pid)
    return actual is not None and abs(actual - start) <= 1


def collect_stale(root: Path | None = None) -> list[Path]:
    """Remove the job directories of owners that are gone; returns what was removed."""
    base = Path(root or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            m = _NAME.match(entry.name)
            if m and entry.is_dir() and not owner_alive(int(m.group(1)), int(m.group(2))):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


@contextlib.contextmanager
def job_directory(kind: str) -> Iterator[Path]:
    """A fresh directory for one job of ``kind``, removed when the block ends; stale ones
    of dead owners are collected first."""
    collect_stale()
    pid = os.getpid()
    start = _start_of(pid) or 0
    path = Path(tempfile.mkdtemp(prefix=f"dlcomm-{kind}-{pid}-{start}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
