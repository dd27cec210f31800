"""Start switch processes for a job (on loopback, or in the emulated core namespace).

Used by ``dlcomm train|bench|emulate`` when an exchange needs a switch and none was named:
each switch runs as ``dlcomm switch serve --bind HOST:0`` (the kernel picks a free port, so
no other process can take it first), started by :func:`dlcomm.runtime.processes.spawn`
(its own session, dies with its parent); it is ready when it prints the address it
listens on, and is stopped when the block ends, leaving its counters in a file that
:attr:`SwitchService.final_stats` holds.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlcomm.errors import DlcommError
from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.processes import spawn, stop
from dlcomm.runtime.signals import interrupts_ignored, interrupts_raised
from dlcomm.switch.daemon import LISTENING
from dlcomm.switch.security import needs_token

__all__ = ["SwitchService", "running_switches", "SWITCH_EXCHANGES", "switches_for_job",
           "needs_switch"]

SWITCH_EXCHANGES = frozenset({"switch", "sparse-switch", "auto"})  # exchanges that talk to a switch
_LISTENING = re.compile(re.escape(LISTENING) + r" (\S+):(\d+) .*sha256 ([0-9a-f]{64})")
START_S = 30.0


@dataclass
class SwitchService:
    addresses: list[tuple[str, int]] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stats_files: list[Path] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    final_stats: list[dict[str, Any]] = field(default_factory=list)  # when the block ends
    fingerprints: list[str] = field(default_factory=list)   # each switch's TLS certificate
    token_file: Path | None = None      # the admin token, for switches beyond loopback

    @property
    def spec_addr(self) -> str:
        return "+".join(f"{h}:{p}" for h, p in self.addresses)

    def spec_options(self) -> dict[str, str]:
        """What an exchange spec needs to reach these switches: addresses, certificate
        fingerprints, the admin token's file."""
        options = {"addr": self.spec_addr, "fp": "+".join(self.fingerprints)}
        if self.token_file is not None:
            options["token_file"] = str(self.token_file)
        return options

    def spec(self, mode: str, **extra: object) -> str:
        """An exchange spec for these switches: ``mode:addr=...,fp=...`` plus ``extra``."""
        options = {**self.spec_options(), **{k: str(v) for k, v in extra.items()}}
        return mode + ":" + ",".join(f"{k}={v}" for k, v in options.items())


def _log_tail(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _wait_listening(proc: subprocess.Popen[bytes], host: str, log: Path,
                    deadline: float) -> tuple[tuple[str, int], str]:
    """The address the switch says it listens on and its certificate's fingerprint (its
    first line in ``log``)."""
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            m = _LISTENING.search(log.read_text(errors="replace"))
            if m:
                return (host, int(m.group(2))), m.group(3)
        if proc.poll() is not None:
            raise DlcommError(f"the switch on {host} did not start: "
                              f"{_log_tail(log) or f'exit code {proc.returncode}'}")
        time.sleep(0.02)
    raise DlcommError(f"the switch on {host} did not start within {START_S:g} s")


@contextlib.contextmanager
def running_switches(host: str, count: int = 1, prefix: Sequence[str] = (),
                     slots: int = 1024, drop_rate: float = 0.0,
                     extra_args: Sequence[str] = ()) -> Iterator[SwitchService]:
    """``count`` switch processes on ``host`` (through ``prefix``, e.g. ip netns exec).

    Readiness is the switch's "listening" line; its counters are written to a file when it
    stops (the parent may not be able to reach an emulated switch over the network).
    """
    service = SwitchService()
    # SIGTERM/SIGHUP as well as SIGINT unwind this block: the switches stop, the logs go
    with interrupts_raised(), job_directory("switch") as tmp:
        if needs_token(host):  # beyond loopback (an emulated core): an admin token
            service.token_file = tmp / "admin.token"
            extra_args = (*extra_args, "--token-file", str(service.token_file))
        try:
            for i in range(count):
                stats_file = tmp / f"switch{i}.json"
                service.stats_files.append(stats_file)
                service.logs.append(tmp / f"switch{i}.log")
                argv = [*prefix, sys.executable, "-m", "dlcomm", "switch", "serve", "--bind",
                        f"{host}:0", "--slots", str(slots), "--drop-rate", str(drop_rate),
                        "--seed", str(i), "--stats-file", str(stats_file), *extra_args]
                service.procs.append(spawn(argv, log=service.logs[-1]))
            deadline = time.monotonic() + START_S
            for proc, log in zip(service.procs, service.logs):
                address, fingerprint = _wait_listening(proc, host, log, deadline)
                service.addresses.append(address)
                service.fingerprints.append(fingerprint)
            yield service
        finally:
            with interrupts_ignored():
                stop(service.procs, grace_s=5.0)
            for stats_file in service.stats_files:
                with contextlib.suppress(OSError, ValueError):
                    service.final_stats.append(json.loads(stats_file.read_text()))


def needs_switch(spec: str) -> bool:
    """Whether ``spec`` talks to a switch but names none (``addr=``)."""
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
    wanted = [needs_switch(s) for s in specs]
    extra = {"drop": str(drop_rate)} if drop_rate else {}
    if not any(wanted):
        yield list(specs), None
        return
    if switch_addr:
        yield [_with_options(s, {"addr": switch_addr.replace(",", "+"), **extra}) if w else s
               for s, w in zip(specs, wanted)], None
        return
    with running_switches(host, shards, prefix, drop_rate=drop_rate) as service:
        yield [_with_options(s, {**service.spec_options(), **extra}) if w else s
               for s, w in zip(specs, wanted)], service
