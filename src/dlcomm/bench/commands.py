"""``dlcomm bench``: measurements of exchanges, written as JSON (never asserted as tests)."""

from __future__ import annotations

from typing import Any

import click

from dlcomm.bench.auth import auth_cmd
from dlcomm.bench.backend_cli import backend_cmd
from dlcomm.bench.fuzz_cli import fuzz_cmd
from dlcomm.bench.switch_cli import switch_cmd
from dlcomm.options import network_options, switch_options
from dlcomm.registry import split_specs

__all__ = ["bench", "validate_cmd", "calibrate_cmd"]


@click.group()
def bench() -> None:
    """Benchmarks: variants measured side by side in one run, JSON results."""


bench.add_command(fuzz_cmd)
bench.add_command(auth_cmd)
bench.add_command(switch_cmd)
bench.add_command(backend_cmd)


@bench.command("allreduce")
@click.option("--exchange", "exchanges", default="ring", show_default=True,
              help="Comma-separated exchange specs, measured in one run (e.g. ring,switch).")
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--size", default="100MB", show_default=True, help="Tensor bytes per worker.")
@click.option("--reps", type=int, default=5, show_default=True, help="Timed repetitions.")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Unmeasured repetitions first, and as many more as an exchange "
                   "runs otherwise at its start (PowerSGD's uncompressed start).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the inputs.")
@click.option("--timeout-s", type=float, default=300.0, show_default=True)
@click.option("--density", type=float, default=1.0, show_default=True,
              help="Fraction of non-zero blocks (or elements) in every input.")
@click.option("--pattern", default="shared", show_default=True,
              help="shared | independent | elementwise sparsity across workers.")
@click.option("--block", type=int, default=256, show_default=True,
              help="Block size of the sparsity pattern.")
@click.option("--interleave", is_flag=True,
              help="Open every exchange at once and take turns, repetition by repetition "
                   "(ratios robust to a machine whose speed drifts).")
@click.option("--json", "json_path", help="Write the JSON result here.")
@switch_options
@network_options
def bench_allreduce(exchanges: str, workers: int, size: str, reps: int, warmup: int, seed: int,
                    timeout_s: float, density: float, pattern: str, block: int,
                    interleave: bool, json_path: str | None, switch: str | None,
                    switch_shards: int, drop_rate: float, **net: Any) -> None:
    """Time all-reduces of SIZE bytes per worker through each exchange, with bounds and errors."""
    from dlcomm.bench.allreduce import AllreduceBench
    from dlcomm.bench.run import SwitchOptions, print_allreduce_table, run_allreduce
    from dlcomm.emulate.placement import NetworkOptions
    from dlcomm.registry import parse_size
    from dlcomm.results import check_writable, write_json

    net_opts = NetworkOptions(net["network"] or "loopback", net["bandwidth"],
                              net["topology"] or "star", net["cluster"], net["mtu"])
    cfg = AllreduceBench(tuple(split_specs(exchanges)), workers, parse_size(size), reps, warmup,
                         seed, timeout_s, density=density, pattern=pattern, block=block,
                         interleave=interleave)
    check_writable(json_path)
    result = run_allreduce(cfg, net_opts, SwitchOptions(switch, switch_shards, drop_rate))
    if json_path:
        write_json(json_path, result)
    print_allreduce_table(result, json_path)


@bench.command("fidelity")
@click.option("--workers", "worker_counts", default="2,4,8", show_default=True,
              help="Worker counts for the ring-vs-bound measurements.")
@click.option("--sizes", default="10MB,100MB", show_default=True)
@click.option("--bandwidth", default="1gbit", show_default=True,
              help="Link rate of the ring measurements (8 workers use half of it).")
@click.option("--workload", default="resnet50", show_default=True)
@click.option("--dilation", type=float, default=10.0, show_default=True,
              help="K; the emulation runs at K and 2K.")
@click.option("--reps", type=int, default=3, show_default=True)
@click.option("--json", "json_path", help="Write the JSON result here.")
def bench_fidelity(worker_counts: str, sizes: str, bandwidth: str, workload: str,
                   dilation: float, reps: int, json_path: str | None) -> None:
    """Emulator fidelity: ring vs its bound for n in WORKERS, and iteration time at K vs 2K."""
    from dlcomm.bench.fidelity import run_fidelity
    from dlcomm.registry import parse_rate, parse_size
    from dlcomm.results import check_writable, write_json

    check_writable(json_path)
    rate = parse_rate(bandwidth)
    counts = [int(n) for n in worker_counts.split(",")]
    cases = [(n, parse_size(size), f"{rate / (2 if n >= 8 else 1):.0f}bit")
             for n in counts for size in sizes.split(",")]
    result = run_fidelity(cases, workload, 4, 5e9, (dilation, 2 * dilation), reps,
                          progress=lambda msg: click.echo(msg, err=True))
    if json_path:
        write_json(json_path, result)
    for row in result["ring"]:
        click.echo(f"ring n={row['workers']} {row['size_bytes'] / 1e6:g} MB at "
                   f"{row['bandwidth']}: {row['time_s'] * 1e3:.0f} ms, bound "
                   f"{row['bound_s'] * 1e3:.0f} ms, ratio {row['time_over_bound']:.3f}")
    for row in result["dilation"]:
        click.echo(f"{workload} at K={row['dilation']:g}: iteration "
                   f"{row['iteration_time_s'] * 1e3:.1f} ms (real scale)")
    s = result["summary"]
    click.echo(f"worst ring/bound {s['worst_time_over_bound']:.3f}; spread across K "
               f"{s['dilation_spread']:.1%}")


@bench.command("sync")
@click.option("--sync", "syncs", default=None,
              help="Comma-separated --sync specs, run one after another (default: bsp, hop "
                   "with its defaults, plain hop, hop with 1 backup, hop with a backup and "
                   "skipping, prague with each generator and through the switch, adpsgd).")
@click.option("--straggler", "scenarios", default="none,3:4,random:p=0.1,x=4",
              show_default=True, help="Comma-separated scenarios: none, RANK:FACTOR, "
                                      "random:p=P,x=FACTOR.")
@click.option("--workers", type=int, default=8, show_default=True)
@click.option("--workload", default="digits-cnn", show_default=True)
@click.option("--compute-ms", type=float, default=80.0, show_default=True,
              help="Emulated compute per step, so that compute dominates on few cores.")
@click.option("--epochs", type=int, default=5, show_default=True)
@click.option("--eval-every", type=int, default=2, show_default=True,
              help="Evaluate every N (mean) steps.")
@click.option("--target", type=float, default=0.95, show_default=True,
              help="Target test accuracy for time-to-target.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--timeout-s", type=float, default=120.0, show_default=True)
@click.option("--json", "json_path", help="Write the JSON result here.")
@click.option("--plot", help="Write a PNG of accuracy over wall time here.")
@network_options
def bench_sync(syncs: str | None, scenarios: str, workers: int, workload: str,
               compute_ms: float, epochs: int, eval_every: int, target: float, seed: int,
               timeout_s: float, json_path: str | None, plot: str | None, **net: Any) -> None:
    """Time to target accuracy of sync protocols, homogeneous and with stragglers."""
    from dlcomm.bench.sync import (
        DEFAULT_SYNCS,
        SyncBench,
        plot_sync,
        print_sync_table,
        run_sync_bench,
    )
    from dlcomm.emulate.placement import NetworkOptions
    from dlcomm.results import check_writable, write_json

    cfg = SyncBench(tuple(split_specs(syncs)) if syncs else DEFAULT_SYNCS,
                    tuple(split_specs(scenarios)), workers, workload, compute_ms, epochs,
                    eval_every, target, seed, timeout_s)
    net_opts = NetworkOptions(net["network"] or "loopback", net["bandwidth"],
                              net["topology"] or "star", net["cluster"], net["mtu"])
    check_writable(json_path, "--json")
    check_writable(plot, "--plot")
    result = run_sync_bench(cfg, net_opts, progress=lambda msg: click.echo(msg, err=True))
    if json_path:
        write_json(json_path, result)
    if plot:
        plot_sync(result, plot)
    print_sync_table(result, json_path)


@bench.command("train", context_settings={"ignore_unknown_options": True,
                                          "allow_extra_args": True})
@click.option("--exchange", "exchanges", default="ring,switch,sparse-switch", show_default=True,
              help="Comma-separated exchange specs, each trained in turn.")
@click.option("--target", required=True, help="METRIC=VALUE, e.g. loss=0.5, accuracy=0.95, "
              "perplexity=200: report the wall time until each run reached it.")
@click.option("--json", "json_path", help="Write the JSON result here.")
@click.option("--run-timeout-s", type=click.FloatRange(min=1), default=3600.0,
              show_default=True, help="Stop a training run (and fail) after this long.")
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def bench_train(exchanges: str, target: str, json_path: str | None, run_timeout_s: float,
                train_args: tuple[str, ...]) -> None:
    """Train the same job through several exchanges (TRAIN_ARGS go to `dlcomm train`)."""
    from dlcomm.bench.train import run_train_bench
    from dlcomm.errors import ConfigError
    from dlcomm.results import check_writable, write_json

    metric, eq, value = target.partition("=")
    try:
        goal = float(value)
    except ValueError:
        raise ConfigError(f"bad --target {target!r} (METRIC=VALUE)") from None
    if not eq:
        raise ConfigError(f"bad --target {target!r} (METRIC=VALUE)")
    check_writable(json_path)
    result = run_train_bench(split_specs(exchanges), list(train_args), metric, goal,
                             progress=lambda msg: click.echo(msg, err=True),
                             run_timeout_s=run_timeout_s)
    if json_path:
        write_json(json_path, result)
    for row in result["results"]:
        ttt = row["time_to_target_s"]
        click.echo(f"{row['exchange']:>28}: {row['time_per_step_s'] * 1e3:8.1f} ms/step, "
                   f"{row['bytes_sent_per_worker_per_step'] / 1e6:8.3f} MB sent/step, "
                   + (f"target at {ttt:.1f} s" if ttt is not None else "target not reached"))


def _keyed(values: tuple[str, ...], convert: Any, what: str) -> dict[str, Any]:
    """``NAME=VALUE`` options -> {NAME: convert(VALUE)}, with a one-line error."""
    from dlcomm.errors import ConfigError

    out = {}
    for item in values:
        key, eq, value = item.partition("=")
        try:
            out[key.strip()] = convert(value)
        except ValueError:
            raise ConfigError(f"bad {what} {item!r} (expected WORKLOAD=VALUE)") from None
        if not eq or not key.strip():
            raise ConfigError(f"bad {what} {item!r} (expected WORKLOAD=VALUE)")
    return out


@bench.command("compression")
@click.option("--parts", default="throughput,accuracy,train", show_default=True,
              help="Which parts: throughput, accuracy, train, emulate (comma-separated).")
@click.option("--size", default="100MB", show_default=True, help="Tensor of the throughput part.")
@click.option("--reps", type=int, default=3, show_default=True)
@click.option("--throughput-methods", default="", help="Compressor specs, comma-separated "
              "(default: every registered compressor with its defaults).")
@click.option("--methods", default="none;fp16;powersgd:rank=4@powersgd;"
              "topk:ratio=0.01@residual;adaptive", show_default=True,
              help="Methods of the accuracy and train parts: SPEC[@MEMORY], ';'-separated.")
@click.option("--workload", "workloads", multiple=True, default=("digits-cnn",),
              show_default=True, help="Workload spec (repeatable).")
@click.option("--target", "targets", multiple=True, default=("digits-cnn=0.95",),
              show_default=True, help="WORKLOAD=VALUE: accuracy to rise to, or perplexity to "
              "fall to (repeatable).")
@click.option("--bandwidths", default="100mbit,1gbit", show_default=True,
              help="Emulated link rates of the train part.")
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--epochs", type=int, help="Epochs per train-part run (default: the workload's).")
@click.option("--steps", multiple=True, help="WORKLOAD=N: stop that workload after N steps.")
@click.option("--eval-every", multiple=True, help="WORKLOAD=N: evaluate every N steps.")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="Train part: runs per method and rate, interleaved; the summary takes "
              "medians.")
@click.option("--seeds", type=int, default=3, show_default=True, help="Accuracy part seeds.")
@click.option("--accuracy-epochs", type=int, default=8, show_default=True)
@click.option("--emulate-models", default="resnet50:8,bert-large:4", show_default=True,
              help="MODEL:WORKERS of the emulate part, comma-separated.")
@click.option("--emulate-bandwidth", default="10gbit", show_default=True)
@click.option("--emulate-methods", default="fp16;powersgd:rank=4@powersgd;"
              "topk:ratio=0.01@residual", show_default=True)
@click.option("--json", "json_path", help="Write the JSON result here.")
@click.option("--plot", help="Write a PNG of the results here.")
def bench_compression(parts: str, size: str, reps: int, throughput_methods: str, methods: str,
                      workloads: tuple[str, ...], targets: tuple[str, ...], bandwidths: str,
                      workers: int, epochs: int | None, steps: tuple[str, ...],
                      eval_every: tuple[str, ...], repeats: int, seeds: int,
                      accuracy_epochs: int,
                      emulate_models: str, emulate_bandwidth: str, emulate_methods: str,
                      json_path: str | None, plot: str | None) -> None:
    """Does compression pay? Throughput, accuracy, time to target, emulated big models."""
    from dlcomm.bench.compression import (
        CompressionBench,
        parse_methods,
        plot_compression,
        print_compression_tables,
        run_compression_bench,
    )
    from dlcomm.compress import make_compressor
    from dlcomm.errors import ConfigError
    from dlcomm.registry import parse_size
    from dlcomm.results import check_writable, write_json

    thr = tuple(split_specs(throughput_methods))
    for spec in thr:
        make_compressor(spec)
    models = []
    for item in filter(None, (p.strip() for p in emulate_models.split(","))):
        model, _, count = item.partition(":")
        if not count.isdigit():
            raise ConfigError(f"bad --emulate-models entry {item!r} (expected MODEL:WORKERS)")
        models.append((model, int(count)))
    cfg = CompressionBench(
        parts=tuple(p.strip() for p in parts.split(",") if p.strip()), throughput_methods=thr,
        size_bytes=parse_size(size), reps=reps, methods=tuple(parse_methods(methods)),
        workloads=workloads, targets=_keyed(targets, float, "--target"),
        bandwidths=tuple(b.strip() for b in bandwidths.split(",") if b.strip()),
        workers=workers, epochs=epochs, steps=_keyed(steps, int, "--steps"),
        eval_every=_keyed(eval_every, int, "--eval-every"), repeats=repeats, seeds=seeds,
        accuracy_epochs=accuracy_epochs, emulate_models=tuple(models),
        emulate_bandwidth=emulate_bandwidth,
        emulate_methods=tuple(parse_methods(emulate_methods)))
    check_writable(json_path)
    check_writable(plot, "--plot")
    result = run_compression_bench(cfg, progress=lambda msg: click.echo(msg, err=True))
    if json_path:
        write_json(json_path, result)
    if plot:
        plot_compression(result, plot)
    print_compression_tables(result, json_path)


# -- `dlcomm simulate validate|calibrate`: they run the emulator, so they live here; the CLI
#    attaches them to the (pure) simulator's command group.

def _say_unless(quiet: bool) -> Any:
    return None if quiet else (lambda line: click.echo(f"  {line}", err=True))


@click.command("validate")
@click.option("--workloads", default="resnet50,vgg19,bert-base", show_default=True)
@click.option("--workers", default="4,8", show_default=True)
@click.option("--dilations", default="10,20", show_default=True,
              help="Time dilation K per worker count.")
@click.option("--bandwidth", default="10gbit", show_default=True, help="Real-scale link rate.")
@click.option("--iterations", type=int, default=2, show_default=True)
@click.option("--warmup", type=int, default=1, show_default=True)
@click.option("--reps", type=int, default=3, show_default=True,
              help="Repetitions per calibration all-reduce.")
@click.option("--calibration", type=click.Choice(["stream", "isolated"]), default="stream",
              show_default=True, help="How the exchanges are calibrated (see `dlcomm "
              "simulate calibrate --mode`).")
@click.option("--json", "json_path", help="Write the JSON result (kind simulate-validate).")
@click.option("--quiet", is_flag=True)
def validate_cmd(workloads: str, workers: str, dilations: str, bandwidth: str, iterations: int,
                 warmup: int, reps: int, calibration: str, json_path: str | None,
                 quiet: bool) -> None:
    """Emulator vs simulator: ring and switch, iteration times and errors (needs root)."""
    from dlcomm.bench.validate import ValidateConfig, validate
    from dlcomm.emulate.cluster import require_root
    from dlcomm.errors import ConfigError
    from dlcomm.plan.simulate.report import print_validation
    from dlcomm.registry import parse_rate
    from dlcomm.results import check_writable, write_json

    try:
        counts = tuple(int(x) for x in workers.split(","))
        ks = tuple(float(x) for x in dilations.split(","))
    except ValueError:
        raise ConfigError("--workers and --dilations are comma-separated numbers") from None
    cfg = ValidateConfig(tuple(w.strip() for w in workloads.split(",") if w.strip()), counts,
                         ks, bandwidth_bps=parse_rate(bandwidth), iterations=iterations,
                         warmup=warmup, reps=reps, calibration=calibration)
    check_writable(json_path, "--json")
    require_root()
    result = validate(cfg, _say_unless(quiet))
    if json_path:
        write_json(json_path, result)
    if not quiet:
        print_validation(result, json_path)


@click.command("calibrate")
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--bandwidth", default="1gbit", show_default=True, help="Emulated link rate.")
@click.option("--exchange", default="ring,switch", show_default=True)
@click.option("--sizes", default="4MB,26MB,52MB", show_default=True)
@click.option("--reps", type=int, default=3, show_default=True)
@click.option("--mode", type=click.Choice(["stream", "isolated"]), default="stream",
              show_default=True, help="stream: back-to-back buckets as DDP sends them; "
              "isolated: one all-reduce at a time (dlcomm bench allreduce).")
@click.option("--json", "json_path", help="Write the JSON result (kind simulate-calibrate).")
def calibrate_cmd(workers: int, bandwidth: str, exchange: str, sizes: str, reps: int,
                  mode: str, json_path: str | None) -> None:
    """Fit each exchange's overhead and efficiency on an emulated star (needs root)."""
    from dlcomm.bench.calibrate import CalibrationConfig, calibrate
    from dlcomm.emulate.cluster import require_root
    from dlcomm.registry import parse_rate, parse_size, split_specs
    from dlcomm.results import check_writable, new_result, write_json

    cfg = CalibrationConfig(workers, parse_rate(bandwidth), tuple(split_specs(exchange)),
                            tuple(parse_size(s) for s in sizes.split(",")), reps, mode=mode)
    for ex in cfg.exchanges:
        if ex not in ("ring", "switch"):
            from dlcomm.errors import ConfigError
            raise ConfigError(f"calibration fits ring and switch, not {ex!r}")
    check_writable(json_path, "--json")
    require_root()
    cal = calibrate(cfg, _say_unless(False))
    result = new_result("simulate-calibrate", cal["config"])
    result["calibration"] = cal
    result["summary"] = {ex: {k: f[k] for k in ("overhead_s", "efficiency", "fit_max_rel_error")}
                         for ex, f in cal["exchanges"].items()}
    if json_path:
        write_json(json_path, result)
    for ex, f in result["summary"].items():
        click.echo(f"{ex}: overhead {f['overhead_s'] * 1e3:.1f} ms per call, efficiency "
                   f"{f['efficiency']:.3f} x the flow model (fit within "
                   f"{f['fit_max_rel_error']:.1%})")
