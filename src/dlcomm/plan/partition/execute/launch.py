"""Start p local worker processes for an executed plan, watch them, collect their reports.

Steps of :func:`run_job`:

1. write the job into a fresh temporary directory (under $TMPDIR) and pick a free port;
2. start p processes ``python -m dlcomm.plan.partition.execute.worker DIR`` with RANK,
   WORLD_SIZE, MASTER_ADDR and MASTER_PORT, each in its own session and set to die with
   this process (PR_SET_PDEATHSIG), so nothing outlives a killed parent;
3. poll every 50 ms; on a failed rank, the deadline, or an exception (Ctrl-C), stop every
   rank still running (SIGTERM to its process group, SIGKILL after 3 s) and raise
   WorkerFailed with the root cause: a rank killed by a signal, else the rank that wrote
   its one-line error first (its peers fail later, on closed connections);
4. read every rank's report and gradient shards, then remove the directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dlcomm.errors import WorkerFailed
from dlcomm.runtime.launcher import describe_exit, free_port

__all__ = ["run_job"]

_PR_SET_PDEATHSIG = 1
GRACE_S = 3.0


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _reported_at(job_dir: Path, rank: int) -> float:
    """When a rank wrote its error line: the first to report is the root cause; its peers
    fail a moment later on closed connections."""
    try:
        return (job_dir / f"rank{rank}.err").stat().st_mtime
    except OSError:
        return float("inf")


def _cause(job_dir: Path, rank: int, proc: subprocess.Popen[bytes]) -> str:
    for name in (f"rank{rank}.err", f"rank{rank}.log"):
        with contextlib.suppress(OSError):
            lines = [x for x in (job_dir / name).read_text().splitlines() if x.strip()]
            if lines:
                return f"{lines[-1].strip()} ({describe_exit(proc.returncode)})"
    return describe_exit(proc.returncode)


def run_job(job: dict[str, Any], world: int, timeout_s: float) -> list[tuple[dict, dict]]:
    """Run the job on ``world`` local ranks; ``[(report, gradient shards)]`` by rank."""
    import torch

    with tempfile.TemporaryDirectory(prefix="dlcomm-partition-") as tmp:
        job_dir = Path(tmp)
        (job_dir / "job.json").write_text(json.dumps({**job, "timeout_s": timeout_s}))
        port = free_port("127.0.0.1")
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(world):
                env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
                with open(job_dir / f"rank{rank}.log", "wb") as log:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "dlcomm.plan.partition.execute.worker", tmp],
                        env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                        start_new_session=True, preexec_fn=_die_with_parent))
            deadline = time.monotonic() + timeout_s + 30
            while True:
                failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
                if failed:
                    rank = min(failed, key=lambda r: (procs[r].returncode >= 0,
                                                      _reported_at(job_dir, r), r))
                    cause = _cause(job_dir, rank, procs[rank])
                    _stop(procs)
                    raise WorkerFailed(rank, cause)
                if all(p.poll() == 0 for p in procs):
                    break
                if time.monotonic() > deadline:
                    _stop(procs)
                    raise WorkerFailed(0, f"no result within {timeout_s + 30:.0f} s")
                time.sleep(0.05)
        finally:
            _stop(procs)
        out = []
        for rank in range(world):
            report = json.loads((job_dir / f"rank{rank}.json").read_text())
            shards = torch.load(job_dir / f"rank{rank}.pt", weights_only=True)
            out.append((report, shards))
        return out
