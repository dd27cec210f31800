"""Shared fixtures: run the CLI as a real subprocess and check nothing is left running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]


def dlcomm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "dlcomm", *args]


def run_dlcomm(*args: str, tmp: Path, timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    """Run ``dlcomm ARGS`` with TMPDIR=tmp so its job files (and processes) are traceable."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run(dlcomm_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=tmp, **kw)


def run_dlcomm_here(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    """``dlcomm ARGS`` in this process, through the command's own error handling
    (:func:`dlcomm.cli.main`), from ``tmp`` with TMPDIR=tmp: for bad input that must end
    before any work starts, without the second an interpreter and torch take to start.
    Every test that uses it keeps one case that runs the real command (:func:`run_dlcomm`)."""
    import contextlib
    import io
    import signal
    import tempfile
    import threading

    from dlcomm.cli import main

    def state() -> tuple[object, ...]:  # what a command must not leave changed
        return (threading.active_count(), psutil.Process().children(),
                [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)])

    out, err = io.StringIO(), io.StringIO()
    cwd, env, tempdir, before = os.getcwd(), dict(os.environ), tempfile.tempdir, state()
    os.chdir(tmp)
    os.environ["TMPDIR"], tempfile.tempdir = str(tmp), None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(cwd)
        # torch sets its own (TORCHINDUCTOR_CACHE_DIR) when it first loads its compiler
        left = {k for k in set(env) | set(os.environ) if k != "TMPDIR" and
                not k.startswith("TORCH") and env.get(k) != os.environ.get(k)}
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = tempdir
    assert not left, f"the command changed the environment: {sorted(left)}"
    assert state() == before, "the command left threads, processes or signal handlers"
    return subprocess.CompletedProcess(["dlcomm", *args], code, out.getvalue(), err.getvalue())


class Rendezvous:
    """The env:// rendezvous of ranks a test starts by hand: the job's store hosted by the
    test itself, as dlcomm's launcher does (no free-port race); alive as long as this is."""

    def __init__(self) -> None:
        from dlcomm.runtime.rendezvous import AGENT_STORE_VAR, hosted_store

        self.store = hosted_store("127.0.0.1")
        self.env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.store.port),
                    AGENT_STORE_VAR: "True"}


class UnusedPort:
    """A TCP port on 127.0.0.1 that nothing listens on while this lives (bound, no listen):
    connections to it are refused."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])

    def __enter__(self) -> UnusedPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def processes_mentioning(fragment: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(fragment in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def assert_no_leftovers(tmp: Path, wait_s: float = 5.0) -> None:
    """No process started from ``tmp`` (the job's TMPDIR) is still alive."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in processes_mentioning(str(tmp)) if p.pid != os.getpid()]
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not alive, f"processes left running: {[p.cmdline() for p in alive]}"


requires_root = pytest.mark.skipif(os.geteuid() != 0,
                                   reason="needs root for network namespaces and tc")


def dlcomm_namespaces() -> list[str]:
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in res.stdout.splitlines() if line.startswith("dlcomm-")]


def leaked(namespaces: set[str]) -> list[str]:
    """Namespaces nobody will remove: their owner process is gone (dlcomm-p{PID}-...), or
    they belong to a named cluster a test made (dlcomm-t...). Namespaces of runs that are
    still going (other jobs on this machine) are not leaks."""
    import psutil

    out = []
    for ns in sorted(namespaces):
        tag = ns[len("dlcomm-"):].split("-")[0]
        if tag.startswith("t") or (tag.startswith("p") and tag[1:].isdigit()
                                   and not psutil.pid_exists(int(tag[1:]))):
            out.append(ns)
    return out


@pytest.fixture(scope="session", autouse=True)
def no_namespaces_left_behind():
    """Every test that builds an emulated cluster must tear it down."""
    before = set(dlcomm_namespaces()) if os.geteuid() == 0 else set()
    yield
    if os.geteuid() == 0:
        deadline = time.monotonic() + 10
        while (left := leaked(set(dlcomm_namespaces()) - before)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"namespaces left behind: {left}"


@pytest.fixture
def job_tmp(tmp_path: Path) -> Path:
    yield tmp_path
    assert_no_leftovers(tmp_path)


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 (pytest's hook)
    """Every run ends with the largest files and functions against the size budget."""
    from tests.sizes import report

    terminalreporter.write_line(report(top=3))
