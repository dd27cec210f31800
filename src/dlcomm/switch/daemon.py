"""``dlcomm switch serve``: the switch as a long-running service.

Steps: check the options; take or make the TLS identity (its fingerprint is printed in the
listening line, which is also what a launcher waits for); load the admin token (required
when listening beyond loopback); start the Prometheus exporter if asked; serve until
SIGINT/SIGTERM; write the final counters. A fatal error (the address taken, the control
plane failing) is one line and exit code 1, so a service manager can restart the switch
(docs/switch.md has a systemd unit).
"""

from __future__ import annotations

import signal
import sys

from dlcomm.errors import ConfigError, DlcommError
from dlcomm.switch.client import parse_addresses
from dlcomm.switch.log import say
from dlcomm.switch.registrations import Limits
from dlcomm.switch.security import identity, load_token, needs_token

__all__ = ["serve", "LISTENING"]

LISTENING = "dlcomm switch listening on"  # the line a launcher waits for


def _limits(options: dict[str, int]) -> Limits:
    return Limits(max_workers=options["max_workers"], max_jobs=options["max_jobs"],
                  max_slots_per_job=options["max_slots_per_job"],
                  registrations_per_minute=options["max_registrations"],
                  max_connections=options["max_connections"],
                  max_connections_per_source=options["max_connections_per_source"])


def serve(bind: str, slots: int, max_k: int | None, drop_rate: float, seed: int,
          job_timeout_s: float, cert: str | None, key: str | None, token_file: str | None,
          metrics: str | None, stats_file: str | None, quiet: bool,
          limit_options: dict[str, int], dataplane: str = "native", threads: int = 1) -> None:
    from dlcomm.results import write_json  # now: serving may leave no descriptor to import
    from dlcomm.switch.server import SwitchServer

    (host, port), = parse_addresses(bind, any_port=True)
    if slots < 1:
        raise ConfigError(f"--slots must be >= 1, got {slots}")
    if not 0 <= drop_rate < 1:
        raise ConfigError(f"--drop-rate must be in [0, 1), got {drop_rate}")
    if threads > 1 and dataplane != "native":
        raise ConfigError("--threads above 1 needs --dataplane native")
    if needs_token(host) and not token_file:
        raise ConfigError(f"--token-file is required when the switch listens beyond "
                          f"loopback ({host})")
    try:
        token = load_token(token_file) if token_file else None
        ident = identity(host, cert, key)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"switch identity: {exc}") from exc
    try:
        server = SwitchServer(host, port, ident, slots, max_k, drop_rate, seed, job_timeout_s,
                              token, _limits(limit_options), dataplane, threads)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {bind}: {exc.strerror or exc}") from exc
    if metrics:
        from dlcomm.switch.metrics import export
        export(server, metrics)

    def stop(_signum: int, _frame: object) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not quiet:
        print(f"{LISTENING} {server.address[0]}:{server.address[1]} ({slots} slots, "
              f"{dataplane} dataplane x{threads}, sha256 {ident.fingerprint})",
              file=sys.stderr, flush=True)
    ending: BaseException | None = None
    try:
        server.run()
    except BaseException as exc:
        ending = exc
        if isinstance(exc, DlcommError):
            raise
        raise DlcommError(f"the switch stopped: {exc!r}") from exc
    finally:
        if stats_file:
            try:
                write_json(stats_file, server.stats())
            except OSError as exc:   # a full disk, say; the reason the switch ended stands
                problem = f"cannot write the statistics file {stats_file}: {exc.strerror or exc}"
                if ending is None:
                    raise DlcommError(problem) from exc
                say(problem)
