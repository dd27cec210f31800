"""``dlcomm simulate``: predict training iterations on planned clusters (docs/simulation.md).

    dlcomm simulate --workload gpt3-175b --accelerators 1024 --topology fattree \\
        --parallelism dp=16,pp=8,tp=8 --exchange ring --json s.json --plot s.png
    dlcomm simulate --workload resnet50 --topology fattree,hxmesh:a=2 \\
        --exchange ring,switch,compressed:method=fp16 --sweep accelerators=64,256,1024,4096
    dlcomm simulate validate --json v.json          (root: emulated networks; dlcomm.bench)
    dlcomm simulate calibrate --workers 4 --bandwidth 1gbit --json c.json     (dlcomm.bench)
    dlcomm simulate packet --workers 4 --size 4MB --bandwidth 1gbit --json p.json
    dlcomm simulate reproduce switchml|hammingmesh|hammingmesh-paper|megatron|nccl --json r.json
    dlcomm simulate --workload bert-base -n 8 --parallelism 2x2x2 --chakra traces/
    dlcomm simulate chakra traces/ [--topology SPEC] --json c.json   (Chakra traces, ASTRA-sim's)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["simulate"]


def _say(quiet: bool) -> Any:
    return None if quiet else (lambda line: click.echo(f"  {line}", err=True))


def _load_calibration(path: str | None) -> dict[str, dict[str, float]] | None:
    if not path:
        return None
    from dlcomm.errors import ConfigError
    from dlcomm.results import read_table_file

    doc = read_table_file(path, "calibration file")
    table = doc.get("calibration", {}).get("exchanges") if doc.get("kind") == \
        "simulate-calibrate" else doc.get("exchanges")
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"calibration file {path} holds no exchanges (write one with "
                          "`dlcomm simulate calibrate --json`)")
    try:
        return {ex: {"overhead_s": float(v["overhead_s"]), "efficiency": float(v["efficiency"])}
                for ex, v in table.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"calibration file {path}: bad entry ({exc})") from None


def _apply(options: list[Callable[..., Any]], func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func`` with ``options``, the first one listed first in the help."""
    for option in reversed(options):
        func = option(func)
    return func


def _workload_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """What is trained, on which topology, split how."""
    return _apply([
        click.option("--workload", help="Catalog model (dlcomm workloads list)."),
        click.option("--accelerators", "-n", type=int, default=0,
                     help="Size the topology to about N accelerators (default: the spec's "
                          "size)."),
        click.option("--topology", default="fattree", show_default=True,
                     help="Planner topology spec(s), comma-separated (dlcomm topo list)."),
        click.option("--parallelism", default="", help="dp=..,pp=..,tp=..[,ep=,micro=,batch=,"
                     "bytes=] or DPxPPxTP (default: data parallel; a missing dp fills N / (pp "
                     "x tp))."),
    ], func)


def _exchange_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """How gradients are exchanged: the exchange, its compression, sparse gradients."""
    return _apply([
        click.option("--exchange", default="ring", show_default=True,
                     help="ring, switch, sparse-switch, auto, compressed:method=M[,over=E]; "
                          "comma-separated for what-if comparisons."),
        click.option("--compress", help="Compressor spec wrapping every exchange (fp16, "
                     "topk:ratio=0.01, powersgd, ...)."),
        click.option("--compress-ratio", type=float, help="Wire bytes per float32 byte "
                     "(default: measured by running the compressor)."),
        click.option("--compress-gbps", type=float, default=100.0, show_default=True,
                     help="GB/s of float32 data the accelerator compresses (and "
                          "decompresses)."),
        click.option("--density", type=float, default=1.0, show_default=True,
                     help="Sparse exchanges: fraction of non-zero gradient blocks per worker."),
        click.option("--sparse-pattern", type=click.Choice(["shared", "independent"]),
                     default="shared", show_default=True),
    ], func)


def _cost_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """What compute and communication cost: the accelerator, the collectives' algorithm,
    placement, schedule, latencies, buckets, links, embeddings and calibrated constants."""
    return _apply([
        click.option("--accelerator", default="v100", show_default=True),
        click.option("--efficiency", type=float,
                     help="Fraction of peak FLOP/s (default 0.4)."),
        click.option("--algorithm", default="best", show_default=True,
                     help="Host all-reduce: best, nccl (NCCL's rings on servers), ring, "
                          "tree, halving-doubling, doubling, torus, hierarchical[:H], "
                          "rails[:H]."),
        click.option("--placement", type=click.Choice(["linear", "random"]), default="linear",
                     show_default=True),
        click.option("--schedule", type=click.Choice(["1f1b", "gpipe", "interleaved"]),
                     default="1f1b", show_default=True),
        click.option("--chunks", type=int, default=1, show_default=True,
                     help="Model chunks per device (with --schedule interleaved)."),
        click.option("--compute", type=click.Choice(["flat", "kernels"]), default="flat",
                     show_default=True, help="flat: FLOPs at --efficiency of peak; kernels: "
                     "GEMM tiles and waves, memory-bound kernels by bytes (GPT models, "
                     "a100/h100)."),
        click.option("--recompute", is_flag=True,
                     help="Activation recomputation: the forward again in the backward."),
        click.option("--alpha-us", type=float, default=1.0, show_default=True,
                     help="Latency per message (us)."),
        click.option("--hop-latency-us", type=float, default=0.5, show_default=True,
                     help="Latency per link of a route (us)."),
        click.option("--bucket-mb", type=float, default=25.0, show_default=True,
                     help="DDP bucket cap (MiB)."),
        click.option("--link-rate", default="400gbit", show_default=True),
        click.option("--ports", type=int, default=4, show_default=True),
        click.option("--radix", type=int, default=64, show_default=True),
        click.option("--replicate-embeddings", is_flag=True,
                     help="Recommenders: all-reduce embeddings (plain DP) instead of sharding "
                          "them."),
        click.option("--calibration", "calibration_file", type=click.Path(dir_okay=False),
                     help="Exchange constants from `dlcomm simulate calibrate --json`."),
    ], func)


def _run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """How many simulations, and where their result goes."""
    return _apply([
        click.option("--sweep", help="accelerators=N,N,...: one simulation per size."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--json", "json_path", help="Write the JSON result (kind simulate) here."),
        click.option("--plot", help="Write a PNG here."),
        click.option("--chakra", "chakra_dir", help="Write the simulated iteration as Chakra "
                     "traces (ASTRA-sim's input) into this new folder; several runs: one "
                     "subfolder each."),
        click.option("--quiet", is_flag=True, help="No progress lines and no table."),
    ], func)


@click.group(invoke_without_command=True)
@_workload_options
@_exchange_options
@_cost_options
@_run_options
@click.pass_context
def simulate(ctx: click.Context, /, **options: Any) -> None:
    """Simulate one training iteration of a workload on a planned topology."""
    if ctx.invoked_subcommand is not None:
        return
    run_simulate(**options)


def run_simulate(workload: str | None, accelerators: int, topology: str, parallelism: str,
                 exchange: str, compress: str | None, compress_ratio: float | None,
                 compress_gbps: float, density: float, sparse_pattern: str, accelerator: str,
                 efficiency: float | None, algorithm: str, placement: str, schedule: str,
                 chunks: int, compute: str, recompute: bool,
                 alpha_us: float, hop_latency_us: float, bucket_mb: float, link_rate: str,
                 ports: int, radix: int, replicate_embeddings: bool,
                 calibration_file: str | None, sweep: str | None, seed: int,
                 json_path: str | None, plot: str | None, chakra_dir: str | None,
                 quiet: bool) -> None:
    """Check the options of ``dlcomm simulate``, run its simulations (one per topology,
    exchange and size), then write, plot and print the result."""
    from dlcomm.errors import ConfigError
    from dlcomm.plan.simulate.iteration import SimConfig
    from dlcomm.plan.simulate.report import plot_simulation, print_simulation
    from dlcomm.plan.simulate.sweep import parse_sweep, run_simulations
    from dlcomm.registry import parse_rate, split_specs
    from dlcomm.results import check_writable, write_json

    if not workload:
        raise ConfigError("--workload is required (or a subcommand: validate, calibrate, "
                          "packet, reproduce)")
    topologies = split_specs(topology)
    exchanges = split_specs(exchange)
    if not topologies or not exchanges:
        raise ConfigError("--topology and --exchange need at least one spec")
    sizes = parse_sweep(sweep) if sweep else None
    base = SimConfig(workload, topologies[0], accelerators, parallelism, exchanges[0], compress,
                     compress_ratio, compress_gbps, density, sparse_pattern, accelerator,
                     efficiency, algorithm, placement, schedule, alpha_us, hop_latency_us,
                     bucket_mb, dilation=1.0, link_rate_gbps=parse_rate(link_rate) / 1e9,
                     ports=ports, radix=radix, replicate_embeddings=replicate_embeddings,
                     seed=seed, calibration=_load_calibration(calibration_file),
                     compute=compute, recompute=recompute, chunks=chunks)
    for spec in exchanges:
        SimConfig(workload, exchange=spec)
    check_writable(json_path, "--json")
    check_writable(plot, "--plot")
    if chakra_dir:
        from dlcomm.plan.simulate.chakra import check_folder
        check_folder(chakra_dir)
    result = run_simulations(base, topologies, exchanges, sizes, _say(quiet))
    if chakra_dir:
        from dlcomm.plan.simulate.chakra_export import export_runs
        export_runs(base, result, chakra_dir, _say(quiet))
    if json_path:
        write_json(json_path, result)
    if plot:
        plot_simulation(result, plot)
    if not quiet:
        print_simulation(result, json_path)


@simulate.command("packet")
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--size", default="4MB", show_default=True)
@click.option("--bandwidth", default="1gbit", show_default=True)
@click.option("--latency-us", type=float, default=5.0, show_default=True)
@click.option("--k", type=int, default=1024, show_default=True, help="Elements per packet.")
@click.option("--window", type=int, default=8, show_default=True, help="Slots per worker.")
@click.option("--json", "json_path", help="Write the JSON result (kind simulate-packet).")
def packet_cmd(workers: int, size: str, bandwidth: str, latency_us: float, k: int, window: int,
               json_path: str | None) -> None:
    """Drive the switch's dataplane over the fake network; compare with the flow model."""
    from dlcomm.plan.simulate.packet import packet_check
    from dlcomm.plan.simulate.report import print_packet
    from dlcomm.registry import parse_rate, parse_size
    from dlcomm.results import check_writable, new_result, write_json

    check_writable(json_path, "--json")
    check = packet_check(workers, parse_size(size), parse_rate(bandwidth), latency_us * 1e-6,
                         k, window)
    result = new_result("simulate-packet", {"workers": workers, "size": size,
                                            "bandwidth": bandwidth, "latency_us": latency_us,
                                            "k": k, "window": window})
    result["check"] = check
    result["summary"] = {key: check[key] for key in ("virtual_s", "flow_model_s",
                                                     "flow_model_error", "packet_model_error")}
    if json_path:
        write_json(json_path, result)
    print_packet(result, json_path)


@simulate.command("reproduce")
@click.argument("which", type=click.Choice(["switchml", "hammingmesh", "hammingmesh-paper",
                                            "megatron", "nccl"]))
@click.option("--json", "json_path", help="Write the JSON result (kind simulate-reproduce).")
@click.option("--plot", help="Write a PNG here (megatron, nccl, hammingmesh-paper: dlcomm "
              "against published).")
@click.option("--quiet", is_flag=True)
def reproduce_cmd(which: str, json_path: str | None, plot: str | None, quiet: bool) -> None:
    """Reproduce a published comparison (docs/simulation.md, docs/topology.md)."""
    from dlcomm.errors import ConfigError
    from dlcomm.plan.simulate.report import print_reproduction
    from dlcomm.plan.simulate.reproduce import REPRODUCTIONS
    from dlcomm.plan.simulate.reproduce_report import PLOTTED, plot_reproduction
    from dlcomm.results import check_writable, write_json

    if plot and which not in PLOTTED:
        raise ConfigError(f"--plot is drawn for {', '.join(PLOTTED)}, not {which}")
    check_writable(json_path, "--json")
    check_writable(plot, "--plot")
    result = REPRODUCTIONS[which](_say(quiet))
    if json_path:
        write_json(json_path, result)
    if plot:
        plot_reproduction(result, plot)
    if not quiet:
        print_reproduction(result, json_path)


@simulate.command("chakra")
@click.argument("traces")
@click.option("--topology", help="Planner topology spec (default: the one dlcomm simulated "
              "the traces on, when they say).")
@click.option("--accelerators", "-n", type=int, default=0,
              help="Size the topology to about N (default: the ranks).")
@click.option("--comm-groups", type=click.Path(dir_okay=False),
              help="ASTRA-sim communicator groups JSON (default: comm_group.json beside).")
@click.option("--algorithm", help="All-reduce: trace (default: the trace's algorithm where it "
              "applies, else best), best, ring, tree, halving-doubling, doubling, torus, "
              "hierarchical[:H], rails[:H].")
@click.option("--alpha-us", type=float, help="Latency per message (us; default 1).")
@click.option("--hop-latency-us", type=float, help="Latency per link (us; default 0.5).")
@click.option("--link-rate", help="Link rate (default 400gbit).")
@click.option("--ports", type=int)
@click.option("--radix", type=int)
@click.option("--json", "json_path", help="Write the JSON result (kind simulate-chakra).")
@click.option("--quiet", is_flag=True)
def chakra_cmd(traces: str, topology: str | None, accelerators: int, comm_groups: str | None,
               algorithm: str | None, alpha_us: float | None, hop_latency_us: float | None,
               link_rate: str | None, ports: int | None, radix: int | None,
               json_path: str | None, quiet: bool) -> None:
    """Run Chakra execution traces (<prefix>.<rank>.et, dlcomm's or ASTRA-sim's) on a
    planned topology."""
    from dataclasses import asdict

    from dlcomm.plan.simulate.chakra import read_trace_set
    from dlcomm.plan.simulate.chakra_exec import exec_config, run_traces
    from dlcomm.registry import parse_rate
    from dlcomm.results import check_writable, new_result, write_json

    check_writable(json_path, "--json")
    trace_set = read_trace_set(traces, comm_groups)
    cfg = exec_config(trace_set, topology=topology, accelerators=accelerators or None,
                      algorithm=algorithm, alpha_us=alpha_us, hop_latency_us=hop_latency_us,
                      link_rate_gbps=parse_rate(link_rate) / 1e9 if link_rate else None,
                      ports=ports, radix=radix)
    out = run_traces(trace_set, cfg)
    s = out["summary"]
    if json_path:
        result = new_result("simulate-chakra", {"traces": traces, "comm_groups": comm_groups,
                                                **asdict(cfg)})
        result.update(summary=s, ranks=out["ranks"], metadata=trace_set.metadata)
        write_json(json_path, result)
    if quiet:
        return
    types = ", ".join(f"{k.removesuffix('_NODE')} {v}" for k, v in s["node_types"].items())
    click.echo(f"Chakra traces {traces}: {s['ranks']} ranks, {s['nodes']} nodes ({types}) "
               f"on {s['topology']}")
    click.echo(f"  iteration {s['iteration_s'] * 1e3:.3f} ms, compute only "
               f"{s['compute_only_s'] * 1e3:.3f} ms, communication exposed "
               f"{s['exposed_comm_s'] * 1e3:.3f} ms (run in {s['simulate_s']:.2f} s)")
    if "recorded_iteration_s" in s:
        click.echo(f"  dlcomm's simulation of this iteration: "
                   f"{s['recorded_iteration_s'] * 1e3:.3f} ms ({s['recorded_error']:+.3%})")
    if json_path:
        click.echo(f"  wrote {json_path}")
