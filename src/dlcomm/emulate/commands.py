"""``dlcomm cluster``: emulated clusters of network namespaces on this machine."""

from __future__ import annotations

import click

__all__ = ["cluster", "emulate"]


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
    from dlcomm.emulate.cluster import (
        forget_cluster,
        list_namespaces,
        remove_namespaces,
        require_root,
    )
    from dlcomm.emulate.plan import PREFIX, check_cluster_name
    from dlcomm.errors import ConfigError

    if name is not None:
        check_cluster_name(name)
    require_root()
    found = list_namespaces()
    if name:
        found = [ns for ns in found if ns.startswith(f"{PREFIX}{name}-")]
        if not forget_cluster(name) and not found:
            raise ConfigError(f"no emulated cluster {name!r} (see `dlcomm cluster status`)")
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


@click.command()
@click.option("--workload", required=True,
              help="Catalog model, e.g. resnet50 (dlcomm workloads list).")
@click.option("--workers", type=int, default=8, show_default=True)
@click.option("--bandwidth", required=True, help="Real-scale link rate, e.g. 10gbit.")
@click.option("--accelerator", default="v100", show_default=True, help="v100, a100, h100, ...")
@click.option("--batch", type=int, help="Samples per accelerator (default: the model's).")
@click.option("--efficiency", type=float, help="Achieved fraction of peak (default 0.4).")
@click.option("--measured-iteration-s", type=float,
              help="A measured compute time per iteration, replacing the estimate.")
@click.option("--dilation", type=float, help="Time dilation K (default: chosen from a "
              "measurement of this machine's capacity).")
@click.option("--exchange", "exchanges", default="ring", show_default=True,
              help="Exchange spec(s), comma-separated: each is measured on the same cluster.")
@click.option("--iterations", type=int, default=3, show_default=True)
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Unmeasured iterations first, and as many more as an exchange runs "
                   "otherwise at its start (PowerSGD's uncompressed start).")
@click.option("--topology", default="star", show_default=True)
@click.option("--json", "json_path", help="Write the JSON result here.")
def emulate(workload: str, workers: int, bandwidth: str, accelerator: str, batch: int | None,
            efficiency: float | None, measured_iteration_s: float | None,
            dilation: float | None, exchanges: str, iterations: int, warmup: int, topology: str,
            json_path: str | None) -> None:
    """Emulate a big model's training iteration on N workers, time-dilated by K."""
    from dlcomm.emulate.dilation import EmulateConfig
    from dlcomm.emulate.emulation import run_emulation
    from dlcomm.emulate.plan import ClusterSpec
    from dlcomm.exchange import EXCHANGES
    from dlcomm.registry import parse_rate, split_specs
    from dlcomm.results import check_writable, write_json

    rate = parse_rate(bandwidth)
    specs = split_specs(exchanges)
    for spec in specs:
        EXCHANGES.check(spec)
    cfg = EmulateConfig(workload, workers, rate, accelerator, batch, efficiency,
                        measured_iteration_s, dilation or 1.0, specs[0], iterations, warmup)
    ClusterSpec("check", workers, rate / cfg.dilation, topology)
    check_writable(json_path)
    result = run_emulation(cfg, topology, auto_dilation=dilation is None, exchanges=specs,
                           progress=lambda line: click.echo(line, err=True))
    if json_path:
        write_json(json_path, result)
    _print_emulation(result, json_path)


def _print_emulation(result: dict, json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    s, c = result["summary"], result["config"]
    rows = result["results"]
    table = Table("real scale", *[r["exchange"] for r in rows],
                  title=f"emulated {c['workload']} on {c['workers']} x {c['accelerator']}, "
                  f"{c['bandwidth_bps'] / 1e9:g} Gbit/s, dilation K={s['dilation']:g}",
                  title_justify="left")
    for label, key in (("iteration time", "iteration_time_s"), ("compute", "compute_s"),
                       ("communication (busy)", "comm_busy_s"),
                       ("communication exposed", "exposed_comm_s"),
                       ("communication overlapped", "overlap_s")):
        table.add_row(label, *[f"{r[key] * 1e3:.1f} ms" for r in rows])
    speedup = next(v for k, v in s.items() if k.startswith("speedup_over_"))
    table.add_row("speedup", *[f"{speedup[r['exchange']]:.2f}x" for r in rows])
    table.add_row("emulation: wall / CPU per iteration",
                  *[f"{r['emulation']['wall_s_per_iteration']:.2f} s / "
                    f"{r['emulation']['cpu_s_per_iteration']:.2f} s" for r in rows])
    table.add_row("emulation: peak memory per worker",
                  *[f"{r['emulation']['peak_rss_bytes_per_worker'] / 2**20:.0f} MiB" for r in rows])
    table.add_row("real cluster: accelerator-seconds per iteration",
                  *[f"{r['real_cluster']['accelerator_s_per_iteration']:.3f} s" for r in rows])
    if json_path:
        table.caption = f"JSON result: {json_path}"
    Console().print(table)
