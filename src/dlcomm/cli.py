"""The ``dlcomm`` command line: parses options, calls one function, prints or writes results.

Errors reach the user as one line, ``dlcomm: error: ...``, with a non-zero exit code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from dlcomm import __version__
from dlcomm.errors import DlcommError
from dlcomm.options import network_options, switch_options

__all__ = ["main", "cli"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dlcomm")
def cli() -> None:
    """dlcomm: the network layer of distributed deep-learning training.

    Run training over pluggable gradient exchanges, emulate clusters on one machine,
    and plan clusters that do not exist yet. Every command that measures writes one JSON
    result (--json), schema in docs/results.md.
    """


def train_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a training job, shared by ``train`` (launcher) and ``worker``."""
    options = [
        click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     help="JSON or TOML file of options (the command line overrides it)."),
        click.option("--workload", help="Workload spec: digits-cnn, stdlib-lm, "
                     "synthetic:tensors=4,numel=1M (see `dlcomm workloads list`)."),
        click.option("--exchange", help="Gradient exchange spec (default: ring)."),
        click.option("--epochs", type=int, help="Passes over the training set."),
        click.option("--steps", type=int, help="Stop after this many steps."),
        click.option("--batch-size", type=int, help="Examples per worker per step."),
        click.option("--lr", type=float, help="Learning rate."),
        click.option("--seed", type=int, help="Seed of model init, data order, data."),
        click.option("--eval-every", type=int, help="Evaluate every N steps (0: each epoch)."),
        click.option("--json", "json_path", help="Write the JSON result here."),
        click.option("--plot", help="Write a PNG of loss and metric here."),
        click.option("--master-addr", help="Rendezvous address (default 127.0.0.1)."),
        click.option("--master-port", type=int, help="Rendezvous port (default: a free one)."),
        click.option("--timeout-s", type=float, help="Deadline of collectives (s)."),
        click.option("--threads", type=int, help="torch threads per worker (0: auto)."),
        click.option("--compress", help="Gradient compression spec, e.g. fp16, topk:ratio=0.01, "
                     "powersgd:rank=4, adaptive (default none)."),
        click.option("--memory", help="Error feedback for --compress: none, residual, ..."),
        click.option("--sync", help="How workers agree on a model: bsp (default), hop:..., "
                     "prague:..., adpsgd."),
        click.option("--backend", type=click.Choice(["gloo", "dlcomm"]),
                     help="Workers' process group: gloo, gradients through a DDP hook "
                     "(default), or dlcomm, --exchange as the c10d backend (DDP, no hook)."),
        click.option("--straggler", help="Slower workers: RANK:FACTOR or random:p=P,x=FACTOR."),
        click.option("--compute-ms", type=float, help="Emulated compute time per step (ms)."),
        click.option("--quiet", is_flag=True, default=None, help="No progress bar or table."),
        click.option("--fault", hidden=True,
                     help="Fault injection: RANK:STEP:raise|exit|kill|hang."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _train_config(config_file: str | None, json_path: str | None, **cli_values: Any) -> Any:
    from dlcomm.train.config import TrainConfig, load_config_file

    file_values = load_config_file(config_file) if config_file else {}
    return TrainConfig.from_sources(file_values, {**cli_values, "json": json_path})


@cli.command()
@click.option("--workers", type=int, help="Worker processes (default 4).")
@switch_options
@network_options
@train_options
def train(switch: str | None, switch_shards: int, drop_rate: float, mtu: int,
          **values: Any) -> None:
    """Train a workload on N workers (DDP over gloo, env:// rendezvous)."""
    from dlcomm.emulate.placement import NetworkOptions, placement
    from dlcomm.exchange import EXCHANGES
    from dlcomm.results import check_writable
    from dlcomm.runtime.launcher import launch
    from dlcomm.switch.service import switches_for_job
    from dlcomm.train.sync import check_sync
    from dlcomm.workloads import WORKLOADS

    cfg = _train_config(**values)
    net = NetworkOptions(cfg.network, cfg.bandwidth, cfg.topology, cfg.cluster, mtu)
    WORKLOADS.check(cfg.workload)
    EXCHANGES.check(cfg.exchange)
    check_sync(cfg.sync, cfg.workers)
    check_writable(cfg.json, "--json")
    check_writable(cfg.plot, "--plot")
    with placement(net, cfg.workers) as place, \
            switches_for_job([cfg.exchange], place.service_host, place.service_prefix(),
                             switch, switch_shards, drop_rate) as (specs, _service):
        job = cfg.replace(master_addr=place.master_addr, exchange=specs[0],
                          extra={**cfg.extra, "network_info": place.info,
                                 "exchange_requested": cfg.exchange})
        launch(job.to_dict(), cfg.workers, place, master_port=cfg.master_port)


@cli.command()
@train_options
def worker(**values: Any) -> None:
    """Run one training worker in place (under `dlcomm train`, torchrun or any env:// launcher).

    \b
    Example on two machines with four workers each:
      torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
          --rdzv-endpoint HOST:29500 -m dlcomm worker --workload digits-cnn --json r.json
    """
    from dlcomm.train.worker import run_worker

    run_as_worker(lambda: run_worker(_train_config(**values)))


@cli.command("run-job", hidden=True)
@click.argument("kind")
@click.option("--config", "config_file", required=True, type=click.Path(dir_okay=False))
def run_job(kind: str, config_file: str) -> None:
    """Run one rank of a job other than training (benchmarks, emulation) in place."""
    import importlib
    import json

    targets = {"bench-allreduce": "dlcomm.bench.allreduce",
               "emulate": "dlcomm.emulate.dilation",
               "partition": "dlcomm.plan.partition.execute.worker"}
    if kind not in targets:
        raise DlcommError(f"unknown job kind {kind!r}")
    module = importlib.import_module(targets[kind])
    run_as_worker(lambda: module.worker_main(json.loads(open(config_file).read())))


def run_as_worker(body: Callable[[], Any]) -> None:
    """Run a rank's body; report a failure once (to the launcher's error file, or stderr)."""
    from dlcomm.runtime.failures import ERROR_FILE_VAR, report_failure

    try:
        body()
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        cause = report_failure(exc)  # kept only if the worker has not reported one already
        if os.environ.get(ERROR_FILE_VAR):
            raise SystemExit(1) from exc  # the launcher reports the cause, once
        raise DlcommError(f"rank {os.environ.get('RANK', '?')}: {cause}") from exc
    # Leave without interpreter finalization: torch's gloo threads can abort the process
    # ("terminate called without an active exception") when C++ statics are destroyed
    # after the job's work is complete; everything the worker owns is flushed and closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@cli.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--plot", help="Write one PNG with every run's loss and metric curves.")
def compare(results: tuple[str, ...], plot: str | None) -> None:
    """Show training results (JSON of dlcomm train) side by side, with speedups."""
    import json
    from pathlib import Path

    from dlcomm.errors import ConfigError
    from dlcomm.results import check_writable, validate_result
    from dlcomm.train.report import plot_train, print_comparison, run_label

    check_writable(plot, "--plot")
    docs = []
    for path in results:
        try:
            doc = json.loads(Path(path).read_text())
            validate_result(doc)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{path}: not a dlcomm result ({exc})") from exc
        if doc["kind"] != "train":
            raise ConfigError(f"{path}: a {doc['kind']!r} result, not a training run")
        docs.append(doc)
    print_comparison(docs, [run_label(d) for d in docs])
    if plot:
        plot_train(docs, plot)


def _register_commands() -> None:
    """Command groups that live with their packages (each imports its heavy parts lazily)."""
    from dlcomm.advise.commands import advise_cmd
    from dlcomm.bench.commands import bench, calibrate_cmd, validate_cmd
    from dlcomm.emulate.commands import cluster, emulate
    from dlcomm.plan.commands import topo
    from dlcomm.plan.partition.commands import partition
    from dlcomm.plan.simulate.commands import simulate
    from dlcomm.switch.commands import switch
    from dlcomm.workloads.commands import workloads

    for command in (workloads, cluster, emulate, switch, bench, topo, partition, simulate,
                    advise_cmd):
        cli.add_command(command)
    # they run the emulator (bench/), but belong with the simulator they check
    simulate.add_command(validate_cmd)
    simulate.add_command(calibrate_cmd)


_register_commands()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; turn every error into one line on stderr and an exit code."""
    try:
        cli.main(args=argv, prog_name="dlcomm", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "dlcomm --help")
        return 0
    except click.Abort:   # click's form of a Ctrl-C (or of EOF at a prompt)
        print("dlcomm: error: interrupted", file=sys.stderr)
        return 130
    except click.ClickException as exc:
        print(f"dlcomm: error: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    except DlcommError as exc:
        print(f"dlcomm: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dlcomm: error: interrupted", file=sys.stderr)
        return 130
    return 0
