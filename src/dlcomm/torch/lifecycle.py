"""The job's switch: a running one that the job joins, or one of its own.

- The exchange spec names the switch (``addr=``) or ``$DLCOMM_SWITCH`` does: the job joins
  that switch as one tenant among others (it registers a job of its own there).
- Neither does: rank 0 starts ``dlcomm switch serve`` (:func:`running_switches`: it dies
  with rank 0, and is stopped when the job's process group is) on the address it uses to
  reach ``MASTER_ADDR`` (or ``$DLCOMM_SWITCH_BIND``), and hands every rank its address and
  certificate fingerprint through the job's store. Only rank 0 needs the admin token (it
  registers the job), so the token never leaves rank 0's host.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dlcomm.errors import ConfigError
from dlcomm.exchange.base import ObjectCollectives
from dlcomm.exchange.switch.bootstrap import local_address
from dlcomm.exchange.switch.spec import SWITCH_ENV
from dlcomm.registry import Spec
from dlcomm.results import write_atomic
from dlcomm.switch.service import SwitchService, needs_switch, running_switches

__all__ = ["JobSwitch", "join_or_start", "default_bind"]


@dataclass
class JobSwitch:
    """The exchange spec that reaches the job's switch, and the switch if it is its own."""

    spec: Spec
    service: SwitchService | None = None     # set on rank 0 of a job with its own switch
    stats_file: str | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def own(self) -> bool:
        return self.service is not None

    def close(self) -> None:
        """Stop the job's own switch (nothing for a joined one); its counters go to
        ``stats_file`` if one was named."""
        self._stack.close()
        if self.service is not None and self.stats_file and self.service.final_stats:
            text = json.dumps(self.service.final_stats[0], indent=2) + "\n"

            def write(tmp: Path) -> None:
                tmp.write_text(text)
            with contextlib.suppress(OSError):
                write_atomic(self.stats_file, write)
            self.stats_file = None


def default_bind(environ: dict[str, str] | None = None) -> str:
    """Where rank 0 starts the job's switch: the address it reaches the job's rendezvous
    host with (loopback if that host is this one by name)."""
    env = os.environ if environ is None else environ
    master = env.get("MASTER_ADDR") or "127.0.0.1"
    try:
        ip = socket.gethostbyname(master)
    except OSError as exc:
        raise ConfigError(f"cannot resolve MASTER_ADDR {master!r} to place the job's "
                          f"switch: {exc} (or set DLCOMM_SWITCH_BIND)") from None
    if ip.startswith("127."):
        return "127.0.0.1"
    return local_address((ip, int(env.get("MASTER_PORT") or 29500)))


def join_or_start(spec: Spec, objects: ObjectCollectives, rank: int,
                  bind: str | None = None, stats_file: str | None = None) -> JobSwitch:
    """The job's switch for ``spec`` (collective: every rank of the group calls it)."""
    if not needs_switch(str(spec)) or os.environ.get(SWITCH_ENV):
        return JobSwitch(spec)
    job = JobSwitch(spec, stats_file=stats_file)
    shared: dict[str, str] | None = None
    try:
        if rank == 0:
            try:
                host = bind or default_bind()
                job.service = job._stack.enter_context(running_switches(host, 1))
            except Exception as exc:  # the others wait for the address: tell them why
                objects.broadcast_from_first({"error": str(exc).strip().splitlines()[0]})
                raise
            options = job.service.spec_options()
            shared = {k: v for k, v in options.items() if k != "token_file"}
            print(f"dlcomm: the job's switch listens on {job.service.spec_addr} "
                  f"(fp {job.service.fingerprints[0][:16]}...)", file=sys.stderr, flush=True)
        shared = objects.broadcast_from_first(shared)
    except BaseException:
        job.close()
        raise
    if not shared or "error" in shared:
        reason = shared["error"] if shared else "it started none"
        raise ConfigError(f"rank 0 could not start the job's switch: {reason}")
    options = {**(job.service.spec_options() if job.service else shared), **spec.options}
    job.spec = Spec(spec.name, options)
    return job
