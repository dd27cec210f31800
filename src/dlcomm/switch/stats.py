"""``dlcomm switch stats``: a running switch's counters, once or live (``--watch``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.switch.client import parse_addresses, request_once

__all__ = ["show_stats", "fetch", "table_of"]


def fetch(address: tuple[str, int], fingerprint: str, token: str | None) -> dict[str, Any]:
    reply = request_once(address, fingerprint, {"op": "stats", "token": token})
    stats: dict[str, Any] = reply["stats"]
    return stats


def table_of(stats: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table("counter", "value", title=f"switch {stats['address']}: "
                  f"{stats['slots_in_use']}/{stats['slots_total']} slots in use, "
                  f"{len(stats['jobs'])} job(s)", title_justify="left")
    for key, value in sorted(stats["counters"].items()):
        table.add_row(key, f"{value:,}")
    for job_id, job in stats["jobs"].items():
        state = "live" if job.get("live") else "attaching"
        if job.get("failure"):
            state = f"failed: {job['failure'][:60]}"
        waiting = job.get("waiting")
        wait = (f", waiting {waiting['since_s']:.1f} s for rank(s) "
                f"{', '.join(map(str, waiting['ranks']))}") if waiting else ""
        table.add_row(f"job {job_id} ({job['name']})",
                      f"{job['workers']} workers, {job['slots']} slots, {state}, "
                      f"{job.get('completions', 0):,} completions{wait}")
    return table


def _read_token(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the admin token {path}: {exc.strerror or exc}") from exc


def show_stats(addr: str, fingerprints: str, token_file: str | None, watch: float | None,
               as_json: bool) -> None:
    from rich.console import Console, Group
    from rich.live import Live

    addresses = parse_addresses(addr)
    fps = [f.strip().lower() for f in fingerprints.replace(",", "+").split("+") if f.strip()]
    if len(fps) != len(addresses):
        raise ConfigError(f"--fingerprint needs one sha256 per switch ({len(addresses)})")
    token = _read_token(token_file) if token_file else None
    if watch is not None and watch <= 0:
        raise ConfigError("--watch needs a positive number of seconds")

    def snapshot() -> list[dict[str, Any]]:
        return [fetch(a, fp, token) for a, fp in zip(addresses, fps)]

    if as_json and watch is None:
        for stats in snapshot():
            print(json.dumps(stats, indent=2))
        return
    if watch is None:
        Console().print(Group(*[table_of(s) for s in snapshot()]))
        return
    with Live(Group(*[table_of(s) for s in snapshot()]), refresh_per_second=4) as live:
        while True:
            time.sleep(watch)
            live.update(Group(*[table_of(s) for s in snapshot()]))
