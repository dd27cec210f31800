"""``dlcomm bench sync``: sync protocols side by side under heterogeneity, in one run.

For each straggler scenario (``none``, ``RANK:FACTOR``, ``random:p=P,x=FACTOR``) and each
``--sync`` spec, one ``dlcomm train`` job (same workload, workers, emulated compute, seed,
evaluation points) runs to completion; its JSON result is read back and reduced to the
time and the steps it took the model to reach the target accuracy, on a training-time
axis: BSP's inline evaluations are taken out of its clock, as the decentralized protocols
evaluate after training (from snapshots). The result (kind
``bench-sync``, docs/sync.md) holds one row per (scenario, sync) in ``results[]`` and the
speedups over ``bsp`` per scenario in ``summary``; ``--plot`` draws accuracy over wall time,
one panel per scenario, one line per protocol.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dlcomm.bench import JOB_DEADLINE_S
from dlcomm.emulate.placement import NetworkOptions, placement
from dlcomm.errors import ConfigError
from dlcomm.registry import parse_spec
from dlcomm.results import new_result, write_atomic
from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.launcher import launch
from dlcomm.train.config import TrainConfig

__all__ = ["SyncBench", "run_sync_bench", "time_to_target", "training_timeline", "plot_sync",
           "print_sync_table", "DEFAULT_SYNCS", "DEFAULT_SCENARIOS"]

# hop: its defaults (straggler-tolerant), then plain Hop, backup alone, backup + skipping,
# each knob spelled out (the defaults set staleness=3, skip=1)
DEFAULT_SYNCS = ("bsp", "hop", "hop:graph=ring,max_gap=4,staleness=0,skip=0",
                 "hop:graph=ring,max_gap=4,backup=1,staleness=0,skip=0",
                 "hop:graph=ring,max_gap=4,backup=1,staleness=0,skip=1", "prague:generator=random",
                 "prague:generator=static", "prague:generator=buffer",
                 "prague:generator=static,impl=switch", "adpsgd")
DEFAULT_SCENARIOS = ("none", "3:4", "random:p=0.1,x=4")


@dataclass(frozen=True)
class SyncBench:
    syncs: tuple[str, ...] = DEFAULT_SYNCS
    scenarios: tuple[str, ...] = DEFAULT_SCENARIOS   # "none" = homogeneous
    workers: int = 8
    workload: str = "digits-cnn"
    compute_ms: float = 80.0
    epochs: int = 5
    eval_every: int = 2
    target: float = 0.95
    seed: int = 0
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        from dlcomm.train.hetero import parse_straggler
        from dlcomm.train.sync import check_sync

        if not self.syncs or not self.scenarios:
            raise ConfigError("bench sync needs at least one --sync and one --straggler")
        for sync in self.syncs:
            check_sync(sync, self.workers)
        for scenario in self.scenarios:
            if scenario != "none":
                rank = parse_straggler(scenario).rank
                if rank is not None and rank >= self.workers:
                    raise ConfigError(f"--straggler {scenario}: rank {rank} is outside the "
                                      f"{self.workers} workers")
        if not 0 < self.target <= 1:
            raise ConfigError(f"--target must be in (0, 1], got {self.target}")
        if self.workers < 2 or self.epochs < 1 or self.eval_every < 1:
            raise ConfigError("--workers >= 2, --epochs >= 1 and --eval-every >= 1")

    def job(self, sync: str, scenario: str, json_path: str) -> TrainConfig:
        exchange = "switch" if "impl=switch" in sync.replace(" ", "") else "ring"
        return TrainConfig(workload=self.workload, workers=self.workers, exchange=exchange,
                           epochs=self.epochs, eval_every=self.eval_every, seed=self.seed,
                           sync=sync, straggler=None if scenario == "none" else scenario,
                           compute_ms=self.compute_ms, quiet=True, json=json_path,
                           timeout_s=self.timeout_s, threads=1)


def time_to_target(evals: list[dict[str, Any]], target: float,
                   metric: str = "accuracy") -> tuple[float | None, float | None]:
    """(time_s, step) of the first evaluation with ``metric >= target``, or (None, None)."""
    for e in evals:
        if e.get(metric) is not None and e[metric] >= target:
            return e["time_s"], e["step"]
    return None, None


def training_timeline(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's evaluations on a training-time axis (evaluation time excluded).

    Decentralized runs evaluate after training, so their ``time_s`` already is training
    time. BSP evaluates inline; each evaluation's own duration (from the end of the step
    before it to its time stamp, on rank 0) is taken out of every later time stamp."""
    evals = doc["evals"]
    if doc["config"].get("sync", "bsp") != "bsp" or not doc.get("steps"):
        return [dict(e) for e in evals]
    ends = {s["step"] + 1: s["time_s"] for s in doc["steps"]}   # steps done -> end time
    spent = 0.0
    out = []
    for e in evals:
        end = ends.get(int(e["step"]), e["time_s"])
        out.append({**e, "time_s": end - spent, "time_with_eval_s": e["time_s"]})
        spent += e["time_s"] - end
    return out


def _row(scenario: str, sync: str, doc: dict[str, Any], target: float) -> dict[str, Any]:
    s = doc["summary"]
    timeline = training_timeline(doc)
    t, step = time_to_target(timeline, target)
    sync_summary = s.get("sync") or {}
    workers = doc["workers"]
    gaps = [w.get("sync", {}).get("max_gap", 0) for w in workers]
    rates = [w["steps"] / w["sync"]["end_time_s"] if w.get("sync") else
             1 / max(w["time_per_step_s"], 1e-9) for w in workers]
    return {
        "scenario": scenario, "sync": sync, "protocol": parse_spec(sync).name,
        "time_to_target_s": t, "steps_to_target": step,
        "final_accuracy": s.get("final_accuracy"),
        "max_accuracy": max((e.get("accuracy", 0.0) for e in doc["evals"]), default=None),
        "wall_time_s": s["wall_time_s"],
        "train_time_s": timeline[-1]["time_s"] if timeline else None,
        "steps_per_s_per_worker": rates,
        "max_iteration_gap": max(gaps) if sync != "bsp" else 1,
        "max_step_spread": sync_summary.get("max_step_spread"),
        "final_consensus_distance": doc["evals"][-1].get("consensus_distance")
        if doc["evals"] else None,
        "bytes_sent_per_worker": s["bytes_sent_per_worker"],
        "bytes_counting": s["bytes_counting"],
        "evals": [{"time_s": e["time_s"], "step": e["step"], "accuracy": e.get("accuracy")}
                  for e in timeline],
        "workers_stats": [w.get("sync", {}).get("stats", {}) for w in workers],
    }


def run_sync_bench(cfg: SyncBench, net: NetworkOptions = NetworkOptions(),
                   progress: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Run every (scenario, sync) job in turn and return the ``bench-sync`` result."""
    from dlcomm.switch.service import switches_for_job

    start = time.perf_counter()
    rows = []
    with job_directory("bench-sync") as tmp:
        for scenario in cfg.scenarios:
            for sync in cfg.syncs:
                path = tmp / f"run{len(rows)}.json"
                job = cfg.job(sync, scenario, str(path))
                t0 = time.perf_counter()
                with placement(net, cfg.workers) as place, \
                        switches_for_job([job.exchange], place.service_host,
                                         place.service_prefix()) as (specs, _service):
                    run = job.replace(master_addr=place.master_addr, exchange=specs[0],
                                      extra={"network_info": place.info,
                                             "exchange_requested": job.exchange})
                    launch(run.to_dict(), cfg.workers, place, deadline_s=JOB_DEADLINE_S)
                rows.append(_row(scenario, sync, json.loads(path.read_text()), cfg.target))
                r = rows[-1]
                progress(f"{scenario:>18}  {sync:<45} to {cfg.target:.0%}: "
                         + (f"{r['time_to_target_s']:.2f} s" if r["time_to_target_s"] else "never")
                         + f"  final {r['final_accuracy']:.2%}  ({time.perf_counter() - t0:.0f} s)")
    result = new_result("bench-sync", {**asdict(cfg), "network": net.network})
    result["results"] = rows
    result["summary"] = _summary(rows, cfg, time.perf_counter() - start)
    return result


def _summary(rows: list[dict[str, Any]], cfg: SyncBench, wall: float) -> dict[str, Any]:
    out: dict[str, Any] = {"target": cfg.target, "workers": cfg.workers, "wall_time_s": wall,
                           "scenarios": {}}
    for scenario in cfg.scenarios:
        mine = [r for r in rows if r["scenario"] == scenario]
        base = next((r["time_to_target_s"] for r in mine if r["sync"] == "bsp"), None)
        out["scenarios"][scenario] = {
            "time_to_target_s": {r["sync"]: r["time_to_target_s"] for r in mine},
            "speedup_over_bsp": {r["sync"]: (base / r["time_to_target_s"]
                                             if base and r["time_to_target_s"] else None)
                                 for r in mine},
            "final_accuracy": {r["sync"]: r["final_accuracy"] for r in mine},
        }
    return out


def print_sync_table(result: dict[str, Any], json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    s = result["summary"]
    wide = max((len(r["sync"]) for r in result["results"]), default=10)
    console = Console(width=max(Console().width, wide + 75))
    for scenario, facts in s["scenarios"].items():
        table = Table(title=f"{s['workers']} workers, straggler: {scenario} (training time, "
                            "evaluation excluded)", title_justify="left")
        table.add_column("sync", no_wrap=True, min_width=wide)
        for name in (f"time to {s['target']:.0%}", "speedup vs bsp", "steps", "final acc",
                     "max gap", "MB sent/worker"):
            table.add_column(name, justify="right")
        for r in (r for r in result["results"] if r["scenario"] == scenario):
            t = r["time_to_target_s"]
            speed = facts["speedup_over_bsp"].get(r["sync"])
            table.add_row(r["sync"], f"{t:.2f} s" if t else "never",
                          f"{speed:.2f}x" if speed else "-",
                          f"{r['steps_to_target']:g}" if r["steps_to_target"] else "-",
                          f"{r['final_accuracy']:.2%}", str(r["max_iteration_gap"]),
                          f"{r['bytes_sent_per_worker'] / 1e6:.1f}")
        if json_path:
            table.caption = f"JSON result: {json_path}"
        console.print(table)


def plot_sync(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Accuracy of the (consensus) model over training time, one panel per scenario."""
    from dlcomm.plots import pyplot
    plt = pyplot()

    scenarios = list(result["summary"]["scenarios"])
    fig, axes = plt.subplots(1, len(scenarios), figsize=(5.5 * len(scenarios), 4.2),
                             squeeze=False)
    target = result["summary"]["target"]
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        for r in (r for r in result["results"] if r["scenario"] == scenario):
            ax.plot([e["time_s"] for e in r["evals"]], [e["accuracy"] for e in r["evals"]],
                    "-", lw=1.2, label=r["sync"])
        ax.axhline(target, color="grey", ls=":", lw=1)
        ax.set_title(f"straggler: {scenario}")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(max(0.0, target - 0.35), 1.0)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"dlcomm bench sync: {result['config']['workload']}, "
                 f"{result['summary']['workers']} workers")
    fig.tight_layout()

    def save(tmp: Path) -> None:
        fig.savefig(tmp, format="png", dpi=110)

    try:
        return write_atomic(path, save)
    finally:
        plt.close(fig)
