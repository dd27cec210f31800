"""``dlcomm workloads``: the trainable workloads and the layer tables of big models."""

from __future__ import annotations

import click

__all__ = ["workloads"]


@click.group()
def workloads() -> None:
    """The workload catalog: trainable workloads and layer tables of big models."""


@workloads.command("list")
def workloads_list() -> None:
    """List the trainable workloads and the big-model layer tables."""
    from rich.table import Table

    from dlcomm.workloads import WORKLOADS
    from dlcomm.workloads.catalog import MODELS, get_model
    from dlcomm.workloads.catalog.report import catalog_rows, wide_console

    console = wide_console()
    table = Table("name", "description", title="trainable workloads", title_justify="left")
    for name in WORKLOADS:
        table.add_row(name, WORKLOADS.doc(name))
    console.print(table)

    models = Table(title="big-model layer tables (`dlcomm workloads show NAME`)",
                   title_justify="left")
    for column, justify in (("name", "left"), ("family", "left"), ("params", "right"),
                            ("published", "right"), ("fwd GFLOPs/sample", "right"),
                            ("sample", "left")):
        models.add_column(column, justify=justify)
    for row in catalog_rows([get_model(name) for name in MODELS]):
        models.add_row(row["name"], row["family"], f"{row['params']:,}",
                       f"{row['published_params'] / 1e6:,.1f}M",
                       _gflops(row["forward_gflops_per_sample"]), row["sample"])
    console.print(models)


def _gflops(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


@workloads.command("show")
@click.argument("name")
@click.option("--accelerator", default="a100", show_default=True,
              help="Accelerator name (v100, a100, h100, tpu-v2, tpu-v3, or one of "
                   "--accelerator-file).")
@click.option("--accelerator-file", type=click.Path(dir_okay=False),
              help="JSON or TOML file of user-defined accelerators.")
@click.option("--batch", type=int, help="Samples per accelerator per iteration "
              "(default: the model's typical batch).")
@click.option("--efficiency", type=float, help="Fraction of peak FLOP/s achieved "
              "(default: the accelerator's, 0.4).")
@click.option("--measured-s", type=float, help="A measured iteration time (s): scale the "
              "per-layer estimates to it.")
@click.option("--bucket-mb", type=float, default=25.0, show_default=True,
              help="Gradient bucket cap in MiB (DDP's bucket_cap_mb).")
@click.option("--all", "show_all", is_flag=True, help="Print every layer (default: "
              "repeated blocks are grouped).")
@click.option("--json", "json_path", help="Write the JSON result (kind workload) here.")
def workloads_show(name: str, accelerator: str, accelerator_file: str | None,
                   batch: int | None, efficiency: float | None, measured_s: float | None,
                   bucket_mb: float, show_all: bool, json_path: str | None) -> None:
    """Show the layer table of catalog model NAME and its compute time per iteration."""
    from dlcomm.errors import ConfigError, RegistryError
    from dlcomm.results import check_writable, write_json
    from dlcomm.workloads.accelerators import ACCELERATORS, get_accelerator, load_accelerators
    from dlcomm.workloads.catalog import get_model, iteration_time, model_buckets
    from dlcomm.workloads.catalog.report import print_workload, workload_result

    model = get_model(name)
    custom = load_accelerators(accelerator_file) if accelerator_file else {}
    if accelerator not in custom and accelerator not in ACCELERATORS:
        known = ", ".join(sorted({*ACCELERATORS.names(), *custom}))
        raise RegistryError(f"unknown accelerator {accelerator!r} (known: {known})")
    acc = custom.get(accelerator) or get_accelerator(accelerator)
    if bucket_mb <= 0:
        raise ConfigError(f"--bucket-mb must be positive, got {bucket_mb}")
    check_writable(json_path, "--json")
    batch = model.default_batch if batch is None else batch
    timing = iteration_time(model, acc, batch, efficiency, measured_s)
    cap = int(bucket_mb * 2**20)
    buckets = model_buckets(model, timing, cap_bytes=cap)
    config = {"model": name, "accelerator": acc.name, "accelerator_file": accelerator_file,
              "batch": batch, "efficiency": timing.efficiency,
              "measured_iteration_s": measured_s, "bucket_cap_bytes": cap,
              "bytes_per_param": 4}
    result = workload_result(model, acc, timing, buckets, config)
    if json_path:
        write_json(json_path, result)
    print_workload(result, model, show_all, json_path)
