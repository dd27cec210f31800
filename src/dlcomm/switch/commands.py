"""``dlcomm switch``: the aggregation switch service and its statistics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["switch"]


@click.group()
def switch() -> None:
    """The in-network aggregation switch (SwitchML protocol) as a service."""


def _limit_options(func: Callable[..., Any]) -> Callable[..., Any]:
    from dlcomm.switch.registrations import Limits

    d = Limits()
    options = [
        click.option("--max-workers", type=click.IntRange(1, 4096), default=d.max_workers,
                     show_default=True, help="Workers per job."),
        click.option("--max-jobs", type=click.IntRange(1, 65534), default=d.max_jobs,
                     show_default=True, help="Jobs at once."),
        click.option("--max-slots-per-job", type=click.IntRange(1), default=d.max_slots_per_job,
                     show_default=True, help="Slots one job may hold."),
        click.option("--max-registrations", type=click.IntRange(1),
                     default=d.registrations_per_minute, show_default=True,
                     help="Registrations per source address per minute."),
        click.option("--max-connections", type=click.IntRange(1), default=d.max_connections,
                     show_default=True, help="Control connections at once."),
        click.option("--max-connections-per-source", type=click.IntRange(1),
                     default=d.max_connections_per_source, show_default=True,
                     help="Control connections from one address at once."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@switch.command("serve")
@click.option("--bind", default="127.0.0.1:9570", show_default=True, help="HOST:PORT (UDP "
              "packets and TCP control on the same port number; port 0: any free one).")
@click.option("--slots", type=int, default=1024, show_default=True,
              help="Slots in the pool, shared by all jobs.")
@click.option("--max-k", type=int, help="Most elements per packet a job may use.")
@click.option("--drop-rate", type=float, default=0.0, show_default=True,
              help="Drop each received and each sent datagram with this probability.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --drop-rate.")
@click.option("--job-timeout-s", type=float, default=600.0, show_default=True,
              help="Free a job whose packets and heartbeats have been silent this long.")
@click.option("--cert", type=click.Path(exists=True, dir_okay=False),
              help="TLS certificate (PEM); default: a fresh self-signed one.")
@click.option("--key", type=click.Path(exists=True, dir_okay=False),
              help="The certificate's private key (PEM).")
@click.option("--token-file", help="Admin token for registration and stats (required beyond "
              "loopback; created with a random token if missing).")
@click.option("--metrics", help="HOST:PORT to export counters in the Prometheus text format.")
@click.option("--dataplane", type=click.Choice(["native", "python"]), default="native",
              show_default=True, envvar="DLCOMM_DATAPLANE",
              help="The packet loop: C (threads, batched system calls) or the Python "
                   "specification ($DLCOMM_DATAPLANE).")
@click.option("--threads", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Native packet threads (sockets sharing the port: SO_REUSEPORT).")
@_limit_options
@click.option("--stats-file", help="Write the final counters (JSON) here on exit.")
@click.option("--quiet", is_flag=True, help="Do not print the listening address.")
def switch_serve(bind: str, slots: int, max_k: int | None, drop_rate: float, seed: int,
                 job_timeout_s: float, cert: str | None, key: str | None,
                 token_file: str | None, metrics: str | None, stats_file: str | None,
                 quiet: bool, dataplane: str, threads: int, **limits: int) -> None:
    """Run the switch until SIGINT/SIGTERM (a fatal error: one line, exit code 1)."""
    from dlcomm.results import check_writable
    from dlcomm.switch.daemon import serve

    check_writable(stats_file, "--stats-file")
    serve(bind, slots, max_k, drop_rate, seed, job_timeout_s, cert, key, token_file,
          metrics, stats_file, quiet, limits, dataplane, threads)


@switch.command("stats")
@click.option("--switch", "addr", default="127.0.0.1:9570", show_default=True,
              help="HOST:PORT of a running switch (several: a:p,b:q).")
@click.option("--fingerprint", "fp", envvar="DLCOMM_SWITCH_FP", required=True,
              help="The switch's certificate fingerprint (sha256, printed by `switch serve`; "
                   "$DLCOMM_SWITCH_FP).")
@click.option("--token-file", help="The switch's admin token (needed beyond loopback).")
@click.option("--watch", type=float, default=None, metavar="SECONDS",
              help="Refresh every SECONDS until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def switch_stats(addr: str, fp: str, token_file: str | None, watch: float | None,
                 as_json: bool) -> None:
    """Counters of a running switch: packets, bytes, drops by reason, jobs, who a job waits on."""
    from dlcomm.switch.stats import show_stats

    show_stats(addr, fp, token_file, watch, as_json)
