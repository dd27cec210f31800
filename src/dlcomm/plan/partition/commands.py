"""``dlcomm partition``: plan tensor partitioning over heterogeneous accelerators (AccPar)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from dlcomm.plan.partition.devices import Cluster
    from dlcomm.plan.partition.graph import PartitionGraph
    from dlcomm.plan.partition.hierarchy import Plan, PlanOptions
    from dlcomm.workloads.catalog.base import ModelTable

__all__ = ["partition"]


def _apply(options: list[Callable[..., Any]], func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func`` with ``options``, the first one listed first in the help."""
    for option in reversed(options):
        func = option(func)
    return func


def _plan_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """What is planned: the workload, the cluster and the constants of the cost model."""
    return _apply([
        click.option("--workload", required=True,
                     help="Catalog model: alexnet, vgg16, vgg19, resnet18, resnet34, resnet50, "
                          "... (`dlcomm workloads list`)."),
        click.option("--devices", help="Device groups in split order, e.g. tpu-v2:64,tpu-v3:64 "
                     "(2^k devices for the binary hierarchy)."),
        click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False),
                     help="TOML or JSON cluster file: devices, between_gbps, "
                          "[accelerators.NAME]."),
        click.option("--batch", type=int, default=512, show_default=True,
                     help="Samples per iteration over the whole cluster."),
        click.option("--efficiency", type=float,
                     help="Fraction of peak FLOP/s for every device (default: each "
                          "accelerator's)."),
        click.option("--between-gbps", type=float, help="Per-device link between groups, "
                     "Gbit/s one way (default: each side keeps its scale-up link)."),
        click.option("--bytes-per-element", type=float, default=2.0, show_default=True,
                     help="Bytes of an activation, weight or gradient element (2: bf16)."),
        click.option("--weight-copies", type=float, default=3.0, show_default=True,
                     help="Copies of the weights in memory (weights, gradients, optimizer "
                          "state)."),
        click.option("--hierarchy", type=click.Choice(["binary", "flat"]),
                     help="binary: AccPar's recursive halving (default); flat: one level, one "
                          "side per device (the default with --execute)."),
    ], func)


def _execute_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Running a plan for real (--execute) and what that run uses."""
    return _apply([
        click.option("--execute", is_flag=True, help="Also run the plan for real: one local "
                     "gloo worker per device (2 to 8), slower devices emulated, gradients and "
                     "bytes checked."),
        click.option("--scheme", default="accpar", show_default=True,
                     help="The scheme --execute runs (dp, owt, hypar, accpar, accpar-equal, "
                          "dp-balanced)."),
        click.option("--steps", type=int, default=2, show_default=True,
                     help="Steps --execute trains."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of weights and data."),
        click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32",
                     show_default=True, help="Element type --execute computes and sends."),
        click.option("--timeout-s", type=float, default=120.0, show_default=True,
                     help="Deadline of the executed run's collectives (s)."),
    ], func)


def _output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Where the result goes: a JSON file, a plot, the table on stdout."""
    return _apply([
        click.option("--json", "json_path", help="Write the JSON result (kind partition) here."),
        click.option("--plot", help="Write a PNG: type map per level, per-layer and total "
                                    "times."),
        click.option("--quiet", is_flag=True, help="No table on stdout."),
    ], func)


@click.command()
@_plan_options
@_execute_options
@_output_options
def partition(**v: Any) -> None:
    """Plan per-layer tensor partitioning over heterogeneous accelerators (AccPar).

    Compares data parallelism, "one weird trick", HyPar and AccPar on the same network and
    cluster: per level of the hierarchy and per layer the partition type and split ratio,
    and the predicted iteration time split into compute and communication.

    \b
    Example:
      dlcomm partition --workload vgg19 --devices tpu-v2:64,tpu-v3:64 --batch 512 \\
          --json vgg19.json --plot vgg19.png
    """
    run_partition(v)


def run_partition(v: dict[str, Any]) -> None:
    """Plan (and with ``--execute`` run) what the options ``v`` of ``dlcomm partition`` ask,
    then write, plot and print the result."""
    import time

    from dlcomm.plan.partition.devices import make_cluster
    from dlcomm.plan.partition.graph import build_graph
    from dlcomm.plan.partition.hierarchy import PlanOptions, compare_schemes
    from dlcomm.plan.partition.report import partition_result
    from dlcomm.results import check_writable
    from dlcomm.workloads.catalog import get_model

    table = get_model(v["workload"])
    cluster = make_cluster(v["devices"], v["cluster_file"], v["between_gbps"], v["efficiency"])
    if v["execute"]:
        table = _executable(v, table, cluster.size)
    check_writable(v["json_path"], "--json")
    check_writable(v["plot"], "--plot")
    options = PlanOptions(v["batch"], v["bytes_per_element"], v["weight_copies"],
                          v["hierarchy"] or ("flat" if v["execute"] else "binary"))
    graph = build_graph(table)
    start = time.perf_counter()
    plans = compare_schemes(graph, cluster, options)
    planning_s = time.perf_counter() - start
    execution = _execute(v, table, graph, cluster, plans, options) if v["execute"] else None
    result = partition_result(plans, _config(v, options, cluster), planning_s, execution)
    _output(v, result, execution)


def _executable(v: dict[str, Any], table: ModelTable, devices: int) -> ModelTable:
    """Check that ``--execute`` can run on ``devices`` devices; the table as executed."""
    from dlcomm.errors import ConfigError
    from dlcomm.plan.partition.execute.model import build_program, executable_table
    from dlcomm.plan.partition.hierarchy import SCHEMES

    if v["hierarchy"] == "binary":
        raise ConfigError("--execute runs one level with one worker per device: use "
                          "--hierarchy flat (the default with --execute)")
    if not 2 <= devices <= 8:
        raise ConfigError(f"--execute starts one worker per device: give 2 to 8 devices, "
                          f"not {devices}")
    if v["steps"] < 1:
        raise ConfigError(f"--steps must be >= 1, got {v['steps']}")
    SCHEMES.check(v["scheme"])
    table = executable_table(table)
    build_program(table)  # fail early if a layer cannot run
    return table


def _execute(v: dict[str, Any], table: ModelTable, graph: PartitionGraph, cluster: Cluster,
             plans: dict[str, Plan], options: PlanOptions) -> dict[str, Any]:
    """Run the ``--scheme`` plan on one local worker per device, the slower ones emulated;
    the result's ``execution`` entry."""
    from dlcomm.plan.partition.execute import ExecPlan, execute, integer_splits
    from dlcomm.plan.partition.hierarchy import plan_scheme
    from dlcomm.plan.partition.report import execution_entry

    chosen = plans.get(v["scheme"]) or plan_scheme(graph, cluster, v["scheme"], options)
    types = [int(t) for t in chosen.root.types]
    rates = [cluster.accelerator(i).peak_flops * cluster.accelerator(i).efficiency
             for i in range(cluster.size)]
    slowdowns = [max(rates) / r for r in rates]
    run_plan = ExecPlan(types, integer_splits(graph, types, chosen.root.shares,
                                              options.batch), slowdowns)
    run = execute(table, [run_plan], batch=options.batch, steps=v["steps"],
                  seed=v["seed"], timeout_s=v["timeout_s"], dtype=v["dtype"])[0]
    return execution_entry(run, chosen, options.batch)


def _config(v: dict[str, Any], options: PlanOptions, cluster: Cluster) -> dict[str, Any]:
    """The result's ``config``: the options as given, the hierarchy, cluster and schemes used."""
    from dlcomm.plan.partition.hierarchy import ABLATIONS, HEADLINE

    config = {key: v[key] for key in ("workload", "devices", "cluster_file", "batch",
                                      "efficiency", "between_gbps", "bytes_per_element",
                                      "weight_copies", "execute", "scheme", "steps", "seed",
                                      "dtype")}
    config.update(hierarchy=options.hierarchy, cluster=cluster.spec(),
                  schemes=list(HEADLINE + ABLATIONS))
    return config


def _output(v: dict[str, Any], result: dict[str, Any], execution: dict[str, Any] | None
            ) -> None:
    """Write, plot and print ``result``; fail if the executed plan disagreed."""
    from dlcomm.errors import DlcommError
    from dlcomm.plan.partition.report import plot_partition, print_partition
    from dlcomm.results import write_json

    if v["json_path"]:
        write_json(v["json_path"], result)
    if v["plot"]:
        plot_partition(result, v["plot"])
    if not v["quiet"]:
        print_partition(result, v["json_path"])
        if execution:
            click.echo(f"executed {execution['scheme']} on {execution['ranks']} workers: max "
                       f"gradient error {execution['max_grad_error']:.2e}, bytes "
                       f"{'match' if execution['bytes_match'] else 'DIFFER from'} the model")
    if execution and not (execution["gradients_match"] and execution["bytes_match"]):
        raise DlcommError("the executed plan disagrees with single-process training or with "
                          "the cost model (see execution.mismatches in the JSON)")
