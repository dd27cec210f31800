"""Child processes that die with their parent, and a stop that always ends them.

:func:`spawn` starts a child in its own session (so that a signal to its group reaches
everything it started) without ``preexec_fn`` (unsafe in a threaded parent) and tells it
its parent's pid in ``$DLCOMM_PARENT_PID``. The child calls :func:`die_with_parent` first
thing (``python -m dlcomm`` does): it asks the kernel for SIGKILL when the parent thread
exits (``PR_SET_PDEATHSIG``) and *then* checks that the parent is still the one it was
started by, so a parent that died before the request was made cannot leave it running
(the race that setting it in the parent between fork and exec leaves open). The signal
comes when the *thread* that started the child ends: start children from a thread that
lives as long as they should (every dlcomm launcher uses its main thread).

:func:`stop` sends SIGTERM to each child's process group, then SIGKILL after a grace
period, and reaps them; :func:`run_child` runs one to completion under a timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from dlcomm.errors import DlcommError
from dlcomm.runtime.signals import interrupts_ignored, interrupts_raised

__all__ = ["spawn", "stop", "run_child", "run_or_fail", "die_with_parent", "die_with",
           "describe_exit", "PARENT_VAR", "GRACE_S", "ChildTimeout"]

PARENT_VAR = "DLCOMM_PARENT_PID"
GRACE_S = 3.0
CHILD_GRACE_S = 3 * GRACE_S + 10  # a dlcomm child's own stop (its ranks), then its cleanup
_PR_SET_PDEATHSIG = 1


class ChildTimeout(Exception):
    """A child did not finish within its timeout (it has been stopped)."""


def describe_exit(returncode: int) -> str:
    """``exited with code 3`` or ``killed by signal SIGKILL``."""
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def die_with_parent() -> None:
    """In a child of :func:`spawn`: be killed when the parent goes, even if it already has.

    Does nothing in a process that :func:`spawn` did not start (torchrun's workers, a shell).
    """
    expected = os.environ.pop(PARENT_VAR, None)  # our own children get their own
    if expected:
        die_with(int(expected))


def die_with(parent: int) -> None:
    """Be killed when ``parent`` (the process that started this one) goes, even if it
    already has: a child that Python's ``multiprocessing`` started calls it first thing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request: we were orphaned
        os._exit(128 + signal.SIGKILL)


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          log: Path | None = None, capture: bool = False,
          cwd: str | None = None) -> subprocess.Popen[Any]:
    """Start ``argv`` in a new session, set up to die with this process (see the module doc).

    Output goes to ``log`` (both streams) if given, to pipes (text) with ``capture``, else
    to this process's own streams.
    """
    child_env = {**(os.environ if env is None else env), PARENT_VAR: str(os.getpid())}
    if capture:
        return subprocess.Popen(list(argv), env=child_env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", start_new_session=True)
    handle: IO[bytes] | None = open(log, "wb") if log is not None else None  # noqa: SIM115
    try:
        return subprocess.Popen(list(argv), env=child_env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=handle, stderr=handle, start_new_session=True)
    finally:
        if handle is not None:
            handle.close()  # the child has its own copy


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def stop(procs: Sequence[subprocess.Popen[Any]], grace_s: float = GRACE_S) -> None:
    """SIGTERM to every running child's group, SIGKILL to what is left after ``grace_s``;
    every child is reaped before this returns."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.02)
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


class _Readers:
    """Read a captured child's stdout whole and its stderr line by line, each line handed
    to ``on_line`` as it comes (progress), in threads of their own."""

    def __init__(self, proc: subprocess.Popen[str], on_line: Callable[[str], None]) -> None:
        self.proc, self.on_line = proc, on_line
        self.out: list[str] = []
        self.err: list[str] = []
        self.failure: BaseException | None = None  # a reader's own error
        self.threads = [threading.Thread(target=self._read, args=(self._out,), daemon=True),
                        threading.Thread(target=self._read, args=(self._err,), daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self, body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException as exc:  # raised in the caller's thread, after the wait
            self.failure = exc

    def _out(self) -> None:
        assert self.proc.stdout is not None
        self.out.append(self.proc.stdout.read())

    def _err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)
            with contextlib.suppress(Exception):  # a failing display ends no child
                self.on_line(line.rstrip("\n"))

    def wait(self, timeout_s: float) -> tuple[str, str]:
        """The child's output once it has exited and its pipes closed, within
        ``timeout_s`` in all (``subprocess.TimeoutExpired`` otherwise, as ``communicate``:
        a grandchild holding a pipe open counts against the time too)."""
        deadline = time.monotonic() + timeout_s
        self.proc.wait(timeout=timeout_s)
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.proc.args, timeout_s)
        return self.finish()

    def finish(self) -> tuple[str, str]:
        for t in self.threads:
            t.join()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        if self.failure is not None:
            raise self.failure
        return "".join(self.out), "".join(self.err)


def run_child(argv: Sequence[str], timeout_s: float, *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, on_line: Callable[[str], None] | None = None
              ) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to completion, capturing its output as text (each stderr line handed to
    ``on_line`` as it comes, if given); stopped (and :class:`ChildTimeout` raised) after
    ``timeout_s``, stopped too if this process is interrupted meanwhile."""
    proc = spawn(argv, env=env, capture=True, cwd=cwd)
    readers = _Readers(proc, on_line) if on_line is not None else None
    try:
        with interrupts_raised():  # a signal to us stops the child with SIGTERM, so that
            out, err = readers.wait(timeout_s) if readers else \
                proc.communicate(timeout=timeout_s)  # it cleans up (not PDEATHSIG)
    except subprocess.TimeoutExpired:
        with interrupts_ignored():
            stop([proc], CHILD_GRACE_S)
            if readers:
                with contextlib.suppress(Exception):  # the group is stopped: pipes close
                    readers.finish()
            else:
                proc.communicate()
        raise ChildTimeout(f"`{' '.join(argv[:5])} ...` did not finish within {timeout_s:g} s"
                           ) from None
    except BaseException:
        with interrupts_ignored():  # a dlcomm child stops its own ranks, then its namespaces
            stop([proc], CHILD_GRACE_S)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_or_fail(argv: Sequence[str], what: str, timeout_s: float,
                on_line: Callable[[str], None] | None = None
                ) -> subprocess.CompletedProcess[str]:
    """:func:`run_child`, raising ``DlcommError("WHAT failed: ...")`` with the child's last
    stderr line (or its exit code) if it fails or runs out of time."""
    try:
        res = run_child(argv, timeout_s, on_line=on_line)
    except ChildTimeout as exc:
        raise DlcommError(f"{what} failed: {exc}") from exc
    if res.returncode != 0:
        lines = res.stderr.strip().splitlines()
        raise DlcommError(f"{what} failed: {lines[-1] if lines else res.returncode}")
    return res
