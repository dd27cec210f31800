"""``dlcomm cluster``: emulated clusters of network namespaces on this machine."""

from __future__ import annotations

import click

__all__ = ["cluster"]


@click.group()
def cluster() -> None:
    """Emulated clusters: one network namespace per host, shaped links (needs root)."""


@cluster.command("up")
@click.option("--hosts", type=int, required=True, help="Worker hosts.")
@click.option("--bandwidth", required=True, help="Link rate, e.g. 100mbit, 1gbit, 10gbit.")
@click.option("--topology", default="star", show_default=True,
              help="star or leafspine:RACKS:HOSTS_PER_RACK:OVERSUB.")
@click.option("--name", default="lab", show_default=True, help="Cluster name (1-12 of a-z0-9).")
def cluster_up(hosts: int, bandwidth: str, topology: str, name: str) -> None:
    """Create a cluster that stays until `dlcomm cluster down` (use it with --cluster NAME)."""
    from dlcomm.emulate.cluster import Cluster, save_cluster
    from dlcomm.emulate.plan import ClusterSpec

    made = Cluster.create(ClusterSpec.from_options(name, hosts, bandwidth, topology))
    save_cluster(made)
    info = made.describe()
    click.echo(f"cluster {name}: {hosts} hosts at {bandwidth} ({topology}); hosts "
               f"{info['addresses'][0]}..{info['addresses'][-1]}, switch namespace {info['core']}")


@cluster.command("down")
@click.option("--name", help="Remove only this cluster (default: every dlcomm namespace).")
def cluster_down(name: str | None) -> None:
    """Remove emulated clusters, including leftovers of crashed runs."""
    from dlcomm.emulate.cluster import forget_cluster, list_namespaces, remove_namespaces, require_root
    from dlcomm.emulate.plan import PREFIX

    require_root()
    found = list_namespaces()
    if name:
        found = [ns for ns in found if ns.startswith(f"{PREFIX}{name}-")]
        forget_cluster(name)
    else:
        from dlcomm.emulate.cluster import STATE_DIR
        for state in STATE_DIR.glob("*.json") if STATE_DIR.is_dir() else []:
            forget_cluster(state.stem)
    removed = remove_namespaces(found)
    click.echo(f"removed {len(removed)} namespace(s)")


@cluster.command("status")
def cluster_status() -> None:
    """List emulated clusters, their hosts, link rates and traffic counters."""
    from rich.console import Console
    from rich.table import Table

    from dlcomm.emulate.cluster import interface_counters, list_namespaces, stale_namespaces
    from dlcomm.emulate.plan import PREFIX

    namespaces = list_namespaces()
    if not namespaces:
        click.echo("no emulated clusters")
        return
    stale = set(stale_namespaces(namespaces))
    table = Table("namespace", "state", "eth0 tx", "eth0 rx", title="emulated clusters",
                  title_justify="left")
    for ns in namespaces:
        tx = rx = "-"
        if "-h" in ns[len(PREFIX):]:
            try:
                c = interface_counters(ns)
                tx, rx = f"{c['tx_bytes']:,}", f"{c['rx_bytes']:,}"
            except Exception:  # noqa: BLE001 (a half-built host shows as such)
                tx = rx = "?"
        table.add_row(ns, "stale (owner gone)" if ns in stale else "up", tx, rx)
    Console().print(table)


@cluster.command("check")
@click.option("--hosts", type=int, default=2, show_default=True)
@click.option("--bandwidth", required=True, help="Link rate, e.g. 200mbit.")
@click.option("--topology", default="star", show_default=True)
@click.option("--seconds", type=float, default=3.0, show_default=True,
              help="Length of the measured transfer.")
@click.option("--json", "json_path", help="Write the JSON result here.")
def cluster_check(hosts: int, bandwidth: str, topology: str, seconds: float,
                  json_path: str | None) -> None:
    """Measure a bulk transfer between two emulated hosts: achieved / configured rate."""
    from dlcomm.emulate.check import check_cluster
    from dlcomm.errors import ConfigError
    from dlcomm.registry import parse_rate
    from dlcomm.results import check_writable, write_json

    if hosts < 2:
        raise ConfigError(f"--hosts must be >= 2 for a transfer, got {hosts}")
    if not 0.5 <= seconds <= 600:
        raise ConfigError(f"--seconds must be in [0.5, 600], got {seconds}")
    check_writable(json_path)
    result = check_cluster(hosts, parse_rate(bandwidth), topology, seconds)
    s = result["summary"]
    click.echo(f"configured {s['configured_bps'] / 1e6:.1f} Mbit/s, achieved "
               f"{s['achieved_bps'] / 1e6:.1f} Mbit/s on the wire (ratio "
               f"{s['achieved_ratio']:.3f}), goodput {s['goodput_bps'] / 1e6:.1f} Mbit/s "
               f"(ratio {s['goodput_ratio']:.3f})")
    if json_path:
        write_json(json_path, result)
