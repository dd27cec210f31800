"""``dlcomm bench backend``: the command line of :mod:`dlcomm.bench.backend`."""

from __future__ import annotations

import click

__all__ = ["backend_cmd"]


@click.command("backend", context_settings={"ignore_unknown_options": True,
                                            "allow_extra_args": True})
@click.option("--reps", type=click.IntRange(1), default=5, show_default=True,
              help="Interleaved pairs of runs.")
@click.option("--warmup", type=click.IntRange(0), default=5, show_default=True,
              help="Steps of each run left out of its median step time.")
@click.option("--json", "json_path", help="Write the JSON result here.")
@click.option("--run-timeout-s", type=click.FloatRange(min=1), default=1800.0,
              show_default=True, help="Stop a training run (and fail) after this long.")
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def backend_cmd(reps: int, warmup: int, json_path: str | None, run_timeout_s: float,
                train_args: tuple[str, ...]) -> None:
    """One job through the DDP hook and through the c10d backend (TRAIN_ARGS go to
    `dlcomm train`, e.g. --workload digits-cnn --workers 4 --exchange switch)."""
    from dlcomm.bench.backend import run_backend_bench
    from dlcomm.errors import ConfigError
    from dlcomm.results import check_writable, write_json

    if "--backend" in train_args:
        raise ConfigError("bench backend sets --backend itself (gloo with the hook, dlcomm)")
    check_writable(json_path)
    result = run_backend_bench(list(train_args), reps, warmup,
                               progress=lambda msg: click.echo(msg, err=True),
                               run_timeout_s=run_timeout_s)
    if json_path:
        write_json(json_path, result)
    s = result["summary"]
    for variant, seconds in s["step_time_s"].items():
        click.echo(f"{variant:>8}: {seconds * 1e3:8.2f} ms/step (median of {reps} runs)")
    click.echo(f"backend / hook: {s['backend_over_hook']:.3f} "
               f"(pairs: median {s['pair_ratio_median']:.3f})")
