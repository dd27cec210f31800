"""Start N workers on this machine with env:// rendezvous, and watch them.

The launcher is the local counterpart of torchrun: every worker gets RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and runs ``dlcomm worker``.

Failure handling (no orphans, bounded exit):
1. each worker runs in its own session and dies with the launcher (PR_SET_PDEATHSIG);
2. the launcher polls every 50 ms; the first worker to exit non-zero fails the job;
3. the others get SIGTERM, then SIGKILL after a grace period;
4. the job raises :class:`WorkerFailed` naming the rank and its cause (its error file, the
   signal that killed it, or its exit code). SIGINT/SIGTERM to the launcher stop all workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from dlcomm.errors import ConfigError, DlcommError, WorkerFailed
from dlcomm.runtime.env import ERROR_FILE_VAR

__all__ = ["launch", "free_port", "check_port_free", "Interrupted", "describe_exit"]

_PR_SET_PDEATHSIG = 1
GRACE_S = 3.0


class Interrupted(DlcommError):
    """The launcher received SIGINT or SIGTERM and stopped the job."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}; all workers stopped")
        self.exit_code = 128 + signum


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def check_port_free(addr: str, port: int) -> None:
    """Raise ConfigError if ``addr:port`` is already taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError as exc:
            raise ConfigError(f"port {port} on {addr} is not available: {exc.strerror}") from exc


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by signal {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Worker:
    rank: int
    proc: subprocess.Popen[bytes]
    error_file: Path
    log_file: Path | None

    def reported_at(self) -> float:
        try:
            return self.error_file.stat().st_mtime
        except OSError:
            return float("inf")

    def cause(self) -> str:
        assert self.proc.returncode is not None
        text = ""
        with contextlib.suppress(OSError):
            text = self.error_file.read_text().strip()
        if not text and self.log_file is not None:
            with contextlib.suppress(OSError):
                lines = [ln for ln in self.log_file.read_text().splitlines() if ln.strip()]
                text = lines[-1].strip() if lines else ""
        exit_text = describe_exit(self.proc.returncode)
        return f"{text} ({exit_text})" if text else exit_text


def _signal(workers: list[_Worker], sig: int) -> None:
    for w in workers:
        if w.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.proc.pid, sig)


def _stop_all(workers: list[_Worker]) -> None:
    _signal(workers, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(w.proc.poll() is None for w in workers):
        time.sleep(0.05)
    _signal(workers, signal.SIGKILL)
    for w in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(timeout=5)


def _first_failure(workers: list[_Worker]) -> _Worker | None:
    failed = [w for w in workers if w.proc.poll() not in (None, 0)]
    if not failed:
        return None
    # The root cause is a worker killed by a signal, else the one that reported first;
    # its peers fail a moment later on closed sockets.
    return min(failed, key=lambda w: (w.proc.returncode >= 0, w.reported_at(), w.rank))


def launch(config: dict, world_size: int, master_addr: str, master_port: int, *,
           entry: Sequence[str] = ("worker",),
           command_prefix: Callable[[int], Sequence[str]] = lambda rank: (),
           extra_env: Callable[[int], dict[str, str]] = lambda rank: {},
           rank0_output: bool = True) -> None:
    """Run ``dlcomm ENTRY --config FILE`` ``world_size`` times and wait for all of them.

    ``command_prefix(rank)`` (e.g. ``ip netns exec NS``) and ``extra_env(rank)`` let the
    emulated network place each worker on its own host.
    """
    workers: list[_Worker] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    with tempfile.TemporaryDirectory(prefix="dlcomm-job-") as tmp:
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps(config))
        try:
            for s in previous:
                signal.signal(s, on_signal)
            for rank in range(world_size):
                env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
                       "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
                       ERROR_FILE_VAR: str(Path(tmp) / f"rank{rank}.err"),
                       "PYTHONUNBUFFERED": "1", **extra_env(rank)}
                log = None if (rank == 0 and rank0_output) else Path(tmp) / f"rank{rank}.log"
                out = open(log, "wb") if log else None  # noqa: SIM115 (closed with the dir)
                argv = [*command_prefix(rank), sys.executable, "-m", "dlcomm", *entry,
                        "--config", str(config_path)]
                proc = subprocess.Popen(argv, env=env, stdout=out, stderr=out,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=_die_with_parent)
                if out:
                    out.close()
                workers.append(_Worker(rank, proc, Path(env[ERROR_FILE_VAR]), log))
            while True:
                failed = _first_failure(workers)
                if failed is not None:
                    cause = failed.cause()
                    _stop_all(workers)
                    raise WorkerFailed(failed.rank, cause)
                if all(w.proc.poll() == 0 for w in workers):
                    return
                time.sleep(0.05)
        finally:
            for s in previous:
                signal.signal(s, signal.SIG_IGN)  # cleanup must not be interrupted
            _stop_all(workers)
            for s, handler in previous.items():
                signal.signal(s, handler)
