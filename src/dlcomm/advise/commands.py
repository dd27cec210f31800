"""``dlcomm advise``: will in-network aggregation, sparsity, compression or decentralized
sync pay for this job? (docs/advise.md)"""

from __future__ import annotations

import click

__all__ = ["advise_cmd"]


@click.command("advise")
@click.option("--workload", help="A trainable workload (digits-cnn, stdlib-lm, ...) or a "
              "catalog model (resnet50, bert-large, ...).")
@click.option("--model", "model_target", help="Your own model: package.module:function "
              "returning (nn.Module, sample batch).")
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--bandwidth", default="10gbit", show_default=True, help="Link rate.")
@click.option("--accelerator", default=None, help="Scale compute to this accelerator "
              "(catalog models: default v100; measured models: default this CPU).")
@click.option("--batch-size", type=int, help="Samples per worker (default: the workload's).")
@click.option("--straggler", help="RANK:FACTOR: one worker FACTOR times slower "
              "(adds bsp against hop and prague).")
@click.option("--compute-ms", type=float, default=0.0, help="Compute per step that is not "
              "this CPU's (an accelerator's), in ms; --verify emulates it (dlcomm train "
              "--compute-ms).")
@click.option("--methods", default="fp16,powersgd:rank=4,topk:ratio=0.01", show_default=True,
              help="Compressors to weigh: comma-separated specs.")
@click.option("--only", help="Weigh only these candidates (comma-separated labels, e.g. "
              "ring,switch).")
@click.option("--verify", "verify_top", type=int, default=0,
              help="Run the top N candidates (and the ring) for real and score the prediction.")
@click.option("--steps", type=int, default=40, show_default=True,
              help="Steps of each verification run (trainable workloads).")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="Runs of each verified candidate, round by round in turning order; the "
              "median is scored.")
@click.option("--host-speedup", type=float, help="The cluster's hosts run the data path "
              "this many times faster than one core here (default: a catalog model's "
              "time-dilated emulation; this machine for a job measured here).")
@click.option("--measure", is_flag=True, help="Measure this machine's data path (loopback) "
              "and, as root, its emulated links, instead of the constants on file.")
@click.option("--calibration", "calibration_path", help="Take the cost model's constants "
              "from this file (the JSON of an earlier advise --measure).")
@click.option("--core-bound/--no-core-bound", default=True, show_default=True,
              help="A trainable job whose workers share this machine's cores: run each "
              "candidate briefly on loopback; its step there bounds the prediction.")
@click.option("--json", "json_path", help="Write the JSON result here.")
@click.option("--plot", "plot_path", help="Write the speedup-against-link-rate plot here.")
def advise_cmd(workload: str | None, model_target: str | None, workers: int, bandwidth: str,
               accelerator: str | None, batch_size: int | None, straggler: str | None,
               compute_ms: float, methods: str, only: str | None, verify_top: int, steps: int,
               repeats: int, host_speedup: float | None, measure: bool,
               calibration_path: str | None, core_bound: bool, json_path: str | None,
               plot_path: str | None) -> None:
    """Predict every candidate exchange for one job, rank them, and (--verify) check."""
    from rich.console import Console

    from dlcomm.advise.cost import load_constants
    from dlcomm.advise.main import run_advise
    from dlcomm.errors import ConfigError
    from dlcomm.results import check_writable, write_json

    check_writable(json_path)
    check_writable(plot_path, "--plot")
    if measure and calibration_path:
        raise ConfigError("--measure and --calibration both name the constants: take one")
    constants = load_constants(calibration_path) if calibration_path else None
    result = run_advise(workload, model_target, workers, bandwidth, accelerator, batch_size,
                        straggler, methods, verify_top, steps,
                        progress=lambda m: click.echo(m, err=True), only=only,
                        constants=constants, measure=measure, host_speedup=host_speedup,
                        compute_ms=compute_ms, repeats=repeats, core_bound=core_bound)
    if json_path:
        write_json(json_path, result)
    if plot_path:
        from dlcomm.advise.report import plot_sweep
        plot_sweep(result, plot_path)
    from dlcomm.advise.report import print_advice
    print_advice(result, Console())
