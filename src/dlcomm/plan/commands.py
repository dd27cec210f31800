"""``dlcomm topo``: topologies, their cost and bandwidth for deep-learning traffic.

    dlcomm topo list
    dlcomm topo show hxmesh:a=2,b=2,x=16,y=16 [--mincut] [--json t.json]
    dlcomm topo compare --accelerators 1024 [--workload gpt3-175b --parallelism
        dp=16,pp=8,tp=8] [--prices prices.toml] --json t.json --plot t.png
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["topo"]


@click.group()
def topo() -> None:
    """Network topologies for deep learning: counts, cost, bandwidth, comparison."""


def _link_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--link-rate", default="400gbit", show_default=True,
                     help="Rate of one link/port, one direction (e.g. 200gbit, 400gbit)."),
        click.option("--ports", type=int, default=4, show_default=True,
                     help="Network ports per accelerator."),
        click.option("--radix", type=int, default=64, show_default=True,
                     help="Ports per switch."),
        click.option("--prices", "prices_file", type=click.Path(dir_okay=False),
                     help="JSON or TOML file overriding prices (switch_port, dac, aoc, "
                          "nic_port, board_trace; USD)."),
        click.option("--allreduce-bytes", default="1GB", show_default=True,
                     help="All-reduce message size for the all-reduce bandwidth."),
        click.option("--alpha-us", type=float, default=1.0, show_default=True,
                     help="Per-message latency of the collective models (microseconds)."),
        click.option("--permutations", type=int, default=1, show_default=True,
                     help="Random permutations sampled for the permutation throughput."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of permutations, random placement and flow samples."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _common(link_rate: str, ports: int, radix: int, prices_file: str | None,
            allreduce_bytes: str, alpha_us: float, permutations: int) -> tuple[Any, ...]:
    from dlcomm.errors import ConfigError
    from dlcomm.plan.prices import load_prices
    from dlcomm.plan.topology import LinkParams
    from dlcomm.registry import parse_rate, parse_size

    params = LinkParams(parse_rate(link_rate) / 1e9, ports, radix)
    nbytes = parse_size(allreduce_bytes)
    if nbytes <= 0:
        raise ConfigError(f"--allreduce-bytes must be > 0, got {allreduce_bytes}")
    if alpha_us < 0:
        raise ConfigError(f"--alpha-us must be >= 0, got {alpha_us}")
    if permutations < 1:
        raise ConfigError(f"--permutations must be >= 1, got {permutations}")
    return params, load_prices(prices_file), float(nbytes), alpha_us * 1e-6


@topo.command("list")
def topo_list() -> None:
    """List the topology kinds and their spec options."""
    from rich.console import Console
    from rich.table import Table

    from dlcomm.plan.topology import TOPOLOGIES

    table = Table("name", "description", title="topologies (`dlcomm topo show SPEC`)",
                  title_justify="left")
    for name in TOPOLOGIES:
        table.add_row(name, TOPOLOGIES.doc(name))
    Console().print(table)


@topo.command("show")
@click.argument("spec")
@_link_options
@click.option("--mincut", is_flag=True, help="Also check the closed-form bisection with a "
              "max-flow min-cut on the per-switch graph (small topologies).")
@click.option("--json", "json_path", help="Write the JSON result (kind topo-show) here.")
def topo_show(spec: str, link_rate: str, ports: int, radix: int, prices_file: str | None,
              allreduce_bytes: str, alpha_us: float, permutations: int, seed: int,
              mincut: bool, json_path: str | None) -> None:
    """Counts, cost and bandwidth of one topology, e.g. hxmesh:a=2,b=2,x=16,y=16."""
    from dlcomm.plan.bandwidth import measure, mincut_gbps
    from dlcomm.plan.prices import SOURCES, network_cost
    from dlcomm.plan.show import print_show
    from dlcomm.plan.topology import build_topology
    from dlcomm.results import check_writable, new_result, write_json

    params, prices, nbytes, alpha = _common(link_rate, ports, radix, prices_file,
                                            allreduce_bytes, alpha_us, permutations)
    check_writable(json_path, "--json")
    topology = build_topology(spec, params)
    counts = topology.counts()
    cost = network_cost(counts, prices)
    bw = measure(topology, nbytes=nbytes, alpha=alpha, permutations=permutations, seed=seed)
    result = new_result("topo-show", {"spec": spec, "link_rate_gbps": params.rate_gbps,
                                      "ports": params.ports, "radix": params.radix,
                                      "prices_file": prices_file, "prices_usd": prices.__dict__,
                                      "price_sources": SOURCES, "allreduce_bytes": nbytes,
                                      "alpha_s": alpha, "permutations": permutations,
                                      "seed": seed})
    result["topology"] = {"name": topology.name, "spec": topology.spec,
                          "accelerators": topology.accelerators,
                          "counts": counts.to_dict(), "cost": cost.to_dict(),
                          "bandwidth": bw.to_dict(),
                          "allreduce_candidates": [
                              c.__dict__ for c in topology.allreduce_candidates(nbytes, alpha)]}
    if mincut:
        if topology.accelerators > 4096:
            from dlcomm.errors import ConfigError
            raise ConfigError("--mincut is for topologies of at most 4096 accelerators")
        low, high = topology.bisection_halves()
        result["topology"]["mincut_gbps"] = mincut_gbps(topology.graph("switches"), low, high)
    result["summary"] = {"accelerators": topology.accelerators, "cost_usd": cost.total,
                         "cost_per_accel_usd": cost.per_accelerator, **bw.to_dict()}
    if json_path:
        write_json(json_path, result)
    print_show(result, json_path)


@topo.command("compare")
@click.option("--accelerators", "-n", type=int, required=True,
              help="Size every topology to about this many accelerators.")
@click.option("--topologies", help="Comma-separated topology specs (default: fat tree "
              "non-blocking/50%/75% tapered, dragonfly, 2D/3D torus, 2D HyperX, Hx2Mesh, "
              "Hx4Mesh); size options left out are filled in.")
@click.option("--workload", help="Catalog model for the per-iteration communication time "
              "(see `dlcomm workloads list`).")
@click.option("--parallelism", help="dp=..,pp=..,tp=..[,ep=..,micro=..,batch=..] or DPxPPxTP "
              "(default: data parallel over all accelerators).")
@click.option("--placement", type=click.Choice(["linear", "random"]), default="linear",
              show_default=True, help="Rank-to-accelerator mapping.")
@_link_options
@click.option("--json", "json_path", help="Write the JSON result (kind topo-compare) here.")
@click.option("--plot", help="Write a PNG of cost and bandwidth per dollar here.")
@click.option("--quiet", is_flag=True, help="No progress lines and no table.")
def topo_compare(accelerators: int, topologies: str | None, workload: str | None,
                 parallelism: str | None, placement: str, link_rate: str, ports: int,
                 radix: int, prices_file: str | None, allreduce_bytes: str, alpha_us: float,
                 permutations: int, seed: int, json_path: str | None, plot: str | None,
                 quiet: bool) -> None:
    """Compare topologies of about N accelerators: cost, bandwidth, per dollar."""
    from dlcomm.errors import ConfigError
    from dlcomm.plan.compare import CompareConfig, compare, plot_compare, print_compare
    from dlcomm.plan.topology import COMPARE_SET, TOPOLOGIES, sized_spec
    from dlcomm.plan.traffic import parse_parallelism
    from dlcomm.registry import split_specs
    from dlcomm.results import check_writable, write_json
    from dlcomm.workloads.catalog import MODELS

    params, prices, nbytes, alpha = _common(link_rate, ports, radix, prices_file,
                                            allreduce_bytes, alpha_us, permutations)
    specs = tuple(split_specs(topologies)) if topologies else COMPARE_SET
    if not specs:
        raise ConfigError("--topologies is empty")
    for spec in specs:
        sized_spec(spec, accelerators, params)      # unknown names and options fail here
        TOPOLOGIES.check(spec)
    if parallelism and not workload:
        raise ConfigError("--parallelism needs --workload")
    if workload:
        MODELS.check(workload)
    par = parse_parallelism(parallelism) if parallelism else None
    check_writable(json_path, "--json")
    check_writable(plot, "--plot")
    cfg = CompareConfig(accelerators, params, prices, specs, workload, par, placement,
                        nbytes, alpha, permutations, seed, prices_file)
    say = None if quiet else (lambda line: click.echo(f"  {line}", err=True))
    result = compare(cfg, say)
    if json_path:
        write_json(json_path, result)
    if plot:
        plot_compare(result, plot)
    if not quiet:
        print_compare(result, json_path)
