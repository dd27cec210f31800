"""``dlcomm switch``: the aggregation switch service and its statistics."""

from __future__ import annotations

import click

__all__ = ["switch"]


@click.group()
def switch() -> None:
    """The in-network aggregation switch (SwitchML protocol) as a service."""


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
              help="Free the slots of a job without packets for this long.")
@click.option("--stats-file", help="Write the final counters (JSON) here on exit.")
@click.option("--quiet", is_flag=True, help="Do not print the listening address.")
def switch_serve(bind: str, slots: int, max_k: int | None, drop_rate: float, seed: int,
                 job_timeout_s: float, stats_file: str | None, quiet: bool) -> None:
    """Run the switch until SIGINT/SIGTERM."""
    import signal

    from dlcomm.errors import ConfigError
    from dlcomm.switch.client import parse_addresses
    from dlcomm.switch.server import SwitchServer
    from dlcomm.switch.service import LISTENING

    (host, port), = parse_addresses(bind, any_port=True)
    if slots < 1:
        raise ConfigError(f"--slots must be >= 1, got {slots}")
    if not 0 <= drop_rate < 1:
        raise ConfigError(f"--drop-rate must be in [0, 1), got {drop_rate}")
    try:
        server = SwitchServer(host, port, slots, max_k, drop_rate, seed, job_timeout_s)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {bind}: {exc.strerror or exc}") from exc

    def stop(_signum: int, _frame: object) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not quiet:
        click.echo(f"{LISTENING} {server.address[0]}:{server.address[1]} ({slots} slots)",
                   err=True)
    try:
        server.run()
    finally:
        if stats_file:
            from dlcomm.results import write_json
            write_json(stats_file, server.stats())


@switch.command("stats")
@click.option("--switch", "addr", default="127.0.0.1:9570", show_default=True,
              help="HOST:PORT of a running switch (several: a:p,b:q).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def switch_stats(addr: str, as_json: bool) -> None:
    """Counters of a running switch: packets, bytes, drops by reason, jobs, slots."""
    import json

    from rich.console import Console
    from rich.table import Table

    from dlcomm.switch.client import parse_addresses, request_once

    for address in parse_addresses(addr):
        stats = request_once(address, {"op": "stats"})["stats"]
        if as_json:
            click.echo(json.dumps(stats, indent=2))
            continue
        table = Table("counter", "value", title=f"switch {stats['address']}: "
                      f"{stats['slots_in_use']}/{stats['slots_total']} slots in use, "
                      f"{len(stats['jobs'])} job(s)", title_justify="left")
        for key, value in sorted(stats["counters"].items()):
            table.add_row(key, f"{value:,}")
        for job_id, job in stats["jobs"].items():
            table.add_row(f"job {job_id} ({job['name']})",
                          f"{job['workers']} workers, {job['slots']} slots, "
                          f"{job.get('completions', 0):,} completions")
        Console().print(table)
