"""Start switch processes for a job (on loopback, or in the emulated core namespace).

Used by ``dlcomm train|bench|emulate`` when an exchange needs a switch and none was named:
each switch runs as ``dlcomm switch serve`` in its own session, dies with its parent
(PR_SET_PDEATHSIG), is ready when it prints that it listens, and is stopped when the block
ends, leaving its counters in a file that :attr:`SwitchService.final_stats` holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from dlcomm.errors import DlcommError

__all__ = ["SwitchService", "running_switches", "BASE_PORT", "SWITCH_EXCHANGES",
           "switches_for_job"]

BASE_PORT = 9570
SWITCH_EXCHANGES = frozenset({"switch", "sparse-switch", "auto"})  # exchanges that talk to a switch


@dataclass
class SwitchService:
    addresses: list[tuple[str, int]]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stats_files: list[Path] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    final_stats: list[dict] = field(default_factory=list)  # filled when the block ends

    @property
    def spec_addr(self) -> str:
        return "+".join(f"{h}:{p}" for h, p in self.addresses)

    def check_alive(self) -> None:
        for proc, addr, log in zip(self.procs, self.addresses, self.logs):
            if proc.poll() is not None:
                raise DlcommError(f"the switch at {addr[0]}:{addr[1]} exited with code "
                                  f"{proc.returncode}: {_log_tail(log)}")


def _die_with_parent() -> None:
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def _log_tail(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _wait_listening(proc: subprocess.Popen[bytes], addr: tuple[str, int], log: Path,
                    deadline: float) -> None:
    """The switch writes one line to its log when it listens."""
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if "dlcomm switch listening" in log.read_text(errors="replace"):
                return
        if proc.poll() is not None:
            raise DlcommError(f"the switch at {addr[0]}:{addr[1]} did not start: "
                              f"{_log_tail(log) or f'exit code {proc.returncode}'}")
        time.sleep(0.05)
    raise DlcommError(f"the switch at {addr[0]}:{addr[1]} did not start within 30 s")


@contextlib.contextmanager
def running_switches(host: str, count: int = 1, prefix: Sequence[str] = (),
                     slots: int = 1024, drop_rate: float = 0.0, base_port: int = 0,
                     extra_args: Sequence[str] = ()) -> Iterator[SwitchService]:
    """``count`` switch processes on ``host`` (through ``prefix``, e.g. ip netns exec).

    Readiness is the switch's "listening" line; its counters are written to a file when it
    stops (the parent may not be able to reach an emulated switch over the network).
    """
    if base_port == 0:
        from dlcomm.runtime.launcher import free_port
        ports = [free_port(host) if not prefix else BASE_PORT + i for i in range(count)]
    else:
        ports = [base_port + i for i in range(count)]
    service = SwitchService([(host, p) for p in ports])
    with tempfile.TemporaryDirectory(prefix="dlcomm-switch-") as tmp:
        try:
            for i, port in enumerate(ports):
                stats_file = Path(tmp) / f"switch{i}.json"
                service.stats_files.append(stats_file)
                service.logs.append(Path(tmp) / f"switch{i}.log")
                argv = [*prefix, sys.executable, "-m", "dlcomm", "switch", "serve", "--bind",
                        f"{host}:{port}", "--slots", str(slots), "--drop-rate", str(drop_rate),
                        "--seed", str(i), "--stats-file", str(stats_file), *extra_args]
                with open(service.logs[-1], "wb") as log:
                    service.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                                          stdout=log, stderr=log,
                                                          start_new_session=True,
                                                          preexec_fn=_die_with_parent))
            deadline = time.monotonic() + 30
            for proc, addr, log in zip(service.procs, service.addresses, service.logs):
                _wait_listening(proc, addr, log, deadline)
            yield service
        finally:
            for proc in service.procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
            for proc in service.procs:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            for stats_file in service.stats_files:
                with contextlib.suppress(OSError, ValueError):
                    service.final_stats.append(json.loads(stats_file.read_text()))


def _needs_switch(spec: str) -> bool:
    from dlcomm.registry import parse_spec
    parsed = parse_spec(spec)
    inner = parsed.options.get("over", "ring") if parsed.name == "compressed" else parsed.name
    return parse_spec(inner).name in SWITCH_EXCHANGES and "addr" not in parsed.options


def _with_options(spec: str, extra: dict[str, str]) -> str:
    from dlcomm.registry import Spec, parse_spec
    parsed = parse_spec(spec)
    return str(Spec(parsed.name, {**extra, **parsed.options}))


@contextlib.contextmanager
def switches_for_job(specs: Sequence[str], host: str, prefix: Sequence[str] = (),
                     switch_addr: str | None = None, shards: int = 1, drop_rate: float = 0.0
                     ) -> Iterator[tuple[list[str], SwitchService | None]]:
    """Give every switch exchange in ``specs`` an address: ``switch_addr`` if named,
    else ``shards`` switch processes started here for the job (stopped afterwards).
    ``drop_rate`` injects loss on both sides (the switch's and the workers')."""
    wanted = [_needs_switch(s) for s in specs]
    extra = {"drop": str(drop_rate)} if drop_rate else {}
    if not any(wanted):
        yield list(specs), None
        return
    if switch_addr:
        yield [_with_options(s, {"addr": switch_addr.replace(",", "+"), **extra}) if w else s
               for s, w in zip(specs, wanted)], None
        return
    with running_switches(host, shards, prefix, drop_rate=drop_rate) as service:
        yield [_with_options(s, {"addr": service.spec_addr, **extra}) if w else s
               for s, w in zip(specs, wanted)], service
