"""Start a job's N ranks with env:// rendezvous, watch them, name the root cause.

The one launcher of every dlcomm job that starts ranks (training, benchmarks, emulation,
executed partition plans); the local counterpart of torchrun. :func:`launch`:

1. makes the job's directory (:mod:`.jobdir`: its config, every rank's failure report and
   log) and hosts the rendezvous store (:mod:`.rendezvous`: no free-port race);
2. starts rank i as ``PREFIX python -m dlcomm ENTRY --config FILE`` (the placement's prefix
   and environment) with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
   MASTER_PORT and ``$DLCOMM_ERROR_FILE``, each in its own session and set to die with the
   launcher (:mod:`.processes`);
3. polls every 50 ms; once a rank has failed (exited non-zero or reported a failure) it
   waits up to :data:`COLLECT_S` for the reports that follow, names the root cause
   (:func:`root_cause`), stops every other rank (SIGTERM, SIGKILL after 3 s) and raises
   :class:`~dlcomm.errors.WorkerFailed`; ``deadline_s`` bounds the whole job;
4. SIGINT/SIGTERM/SIGHUP stop every rank and raise :class:`Interrupted` (exit 128+signal).

Root cause, when several ranks fail (a peer of a dead rank fails a moment later, on a
closed connection or a timeout): first a rank that reported an error of its own (its code
raised), then a rank that died without a report (a signal, ``os._exit``), then a rank that
reported a peer's failure (a collective or an exchange broke); within each, the earliest
(report time, or the moment its death was seen), then the lowest rank. A worker reports its
own error before it closes its sockets (:mod:`.failures`), so its report precedes anything
its peers can see, whatever order the processes then exit in.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlcomm.errors import ConfigError, WorkerFailed
from dlcomm.runtime.failures import ERROR_FILE_VAR, Report, read_report
from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.placement import Placement
from dlcomm.runtime.processes import describe_exit, spawn, stop
from dlcomm.runtime.rendezvous import AGENT_STORE_VAR, hosted_store
from dlcomm.runtime.signals import Interrupted, interrupts_ignored, interrupts_raised

__all__ = ["launch", "Interrupted", "RankState", "root_cause", "COLLECT_S", "POLL_S"]

POLL_S = 0.05
COLLECT_S = 1.0   # after the first failure, wait this long for the reports that follow it


@dataclass
class RankState:
    """What the launcher knows of one rank."""

    rank: int
    returncode: int | None = None   # None: still running
    report: Report | None = None
    seen_failed_at: float = 0.0     # time.time() when its death was first seen
    last_output: str = ""

    @property
    def failed(self) -> bool:
        return self.report is not None or self.returncode not in (None, 0)

    def cause(self) -> str:
        exit_text = describe_exit(self.returncode) if self.returncode is not None else ""
        if self.report is not None:
            return f"{self.report.cause} ({exit_text})" if exit_text else self.report.cause
        if self.last_output:
            return f"{exit_text}; last output: {self.last_output}"
        return exit_text


def root_cause(ranks: Sequence[RankState]) -> RankState | None:
    """The rank whose failure caused the others' (the rules in the module docstring)."""
    failed = [r for r in ranks if r.failed]
    if not failed:
        return None

    def order(r: RankState) -> tuple[int, float, int]:
        if r.report is not None and not r.report.peer:
            return (0, r.report.time, r.rank)
        if r.report is None:
            return (1, r.seen_failed_at, r.rank)
        return (2, r.report.time, r.rank)
    return min(failed, key=order)


@dataclass
class _Rank:
    state: RankState
    proc: Any
    error_file: Path
    log_file: Path | None = None

    def refresh(self, now: float) -> None:
        s = self.state
        if s.report is None:
            s.report = read_report(self.error_file)
        if s.returncode is None:
            code = self.proc.poll()
            if code is not None:
                s.returncode = code
                if code != 0 and s.report is None:
                    s.report = read_report(self.error_file)
                if code != 0:
                    s.seen_failed_at = now
                    s.last_output = _last_line(self.log_file)


def _last_line(path: Path | None) -> str:
    if path is None:
        return ""
    with contextlib.suppress(OSError):
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                 if ln.strip()]
        return lines[-1][:300] if lines else ""
    return ""


def _rank_env(rank: int, world: int, place: Placement, port: int, error_file: Path
              ) -> dict[str, str]:
    import os

    return {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": place.master_addr, "MASTER_PORT": str(port),
            AGENT_STORE_VAR: "True", ERROR_FILE_VAR: str(error_file),
            "PYTHONUNBUFFERED": "1", **place.env(rank)}


def _host_store(place: Placement, master_port: int) -> Any:
    try:
        return hosted_store(place.master_addr, master_port, place.netns(0))
    except ConfigError as exc:
        if master_port:
            reason = str(exc).rpartition(": ")[2]
            raise ConfigError(f"port {master_port} on {place.master_addr} is not available: "
                              f"{reason}") from exc
        raise


def launch(config: dict[str, Any], workers: int, place: Placement | None = None, *,
           entry: Sequence[str] = ("worker",), master_port: int = 0,
           rank0_output: bool = True, deadline_s: float | None = None,
           kind: str = "job", module: str = "dlcomm") -> None:
    """Run ``python -m MODULE ENTRY --config FILE`` (``dlcomm worker`` by default) on
    ``workers`` ranks and wait for all of them (the steps of the module docstring);
    ``config`` is written to FILE as JSON."""
    place = place or Placement()
    ranks: list[_Rank] = []
    with job_directory(kind) as tmp, interrupts_raised():
        config_path = tmp / "config.json"
        config_path.write_text(json.dumps(config))
        store = _host_store(place, master_port)
        try:
            for rank in range(workers):
                error_file = tmp / f"rank{rank}.err"
                log = None if (rank == 0 and rank0_output) else tmp / f"rank{rank}.log"
                argv = [*place.prefix(rank), sys.executable, "-m", module, *entry,
                        "--config", str(config_path)]
                proc = spawn(argv, env=_rank_env(rank, workers, place, store.port, error_file),
                             log=log)
                ranks.append(_Rank(RankState(rank), proc, error_file, log))
            _watch(ranks, deadline_s)
        finally:
            with interrupts_ignored():
                stop([r.proc for r in ranks])
                del store


def _watch(ranks: list[_Rank], deadline_s: float | None) -> None:
    """Poll until every rank succeeded (return) or the job failed (raise)."""
    deadline = time.monotonic() + deadline_s if deadline_s else None
    collect_until: float | None = None
    while True:
        now = time.time()
        for r in ranks:
            r.refresh(now)
        states = [r.state for r in ranks]
        if any(s.failed for s in states):
            if collect_until is None:
                collect_until = time.monotonic() + COLLECT_S
            everyone_done = all(s.returncode is not None for s in states)
            if everyone_done or time.monotonic() >= collect_until:
                culprit = root_cause(states)
                assert culprit is not None
                raise WorkerFailed(culprit.rank, culprit.cause())
        elif all(s.returncode == 0 for s in states):
            return
        if deadline is not None and time.monotonic() > deadline:
            raise WorkerFailed(0, f"the job did not finish within {deadline_s:g} s")
        time.sleep(POLL_S)
