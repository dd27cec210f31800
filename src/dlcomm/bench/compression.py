"""``dlcomm bench compression``: does gradient compression pay off, and when?

Four parts, each optional, in one ``bench-compression`` JSON result (docs/compression.md):

1. ``throughput``: compress + decompress of one flat float32 tensor (100 MB by default) per
   method on this CPU, median of the repetitions: MB/s, the payload's compression ratio and
   the bytes per element each exchange really carries (ring and switch wire forms);
2. ``accuracy``: ``dlcomm train`` on loopback per method and seed: final and best test
   accuracy against the uncompressed run of the same seed (accuracy does not depend on the
   network, so this part does not need an emulated one);
3. ``train``: ``dlcomm train`` per workload, emulated link rate and method: the wall time
   until the first evaluation reaches the target (accuracy >= or perplexity <=), time per
   step and bytes per step, against the uncompressed and fp16 runs at the same rate;
4. ``emulate``: time-dilated iterations of catalog models (``dlcomm emulate``) through the
   ``compressed`` exchange: iteration time and speedup over the uncompressed ring.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from dlcomm.errors import ConfigError
from dlcomm.registry import parse_rate, parse_spec
from dlcomm.results import new_result
from dlcomm.plots import save_figure
from dlcomm.runtime.jobdir import job_directory

__all__ = ["Method", "parse_methods", "CompressionBench", "run_compression_bench",
           "throughput_rows", "print_compression_tables", "plot_compression", "PARTS"]

PARTS = ("throughput", "accuracy", "train", "emulate")
# every compressor with its defaults, but threshold's tau set to keep 1% of N(0, 1) data
DEFAULT_THROUGHPUT = ["none", "fp16", "bf16", "topk", "randomk", "threshold:tau=2.576", "dgc",
                      "qsgd", "terngrad", "u8bit", "signsgd", "signum", "efsignsgd", "onebit",
                      "natural", "powersgd", "powersgd:rank=4"]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Method:
    """A compressor spec and the memory it runs with."""

    compress: str
    memory: str = "none"

    @property
    def label(self) -> str:
        return self.compress if self.memory == "none" else f"{self.compress}+{self.memory}"

    def exchange_spec(self) -> str:
        """The same method as a ``compressed:`` exchange spec (for ``dlcomm emulate``)."""
        if self.compress == "none":
            return "ring"
        spec = parse_spec(self.compress)
        opts = ",".join(f"{k}={v}" for k, v in spec.options.items())
        return (f"compressed:method={spec.name}" + (f",{opts}" if opts else "")
                + (f",memory={self.memory}" if self.memory != "none" else ""))


def parse_methods(text: str) -> list[Method]:
    """``none;fp16;topk:ratio=0.01@residual;adaptive`` -> methods (``@`` names the memory)."""
    from dlcomm.compress import COMPRESSORS, MEMORIES

    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        compress, _, memory = part.partition("@")
        name = parse_spec(compress).name
        if name != "adaptive":
            COMPRESSORS.check(compress)
        MEMORIES.check(memory or "none")
        out.append(Method(compress, memory or "none"))
    if not out:
        raise ConfigError("no compression method given")
    return out


@dataclass(frozen=True)
class CompressionBench:
    parts: tuple[str, ...] = ("throughput", "accuracy", "train")
    throughput_methods: tuple[str, ...] = ()           # default: every registered compressor
    size_bytes: int = 100_000_000
    reps: int = 3
    methods: tuple[Method, ...] = ()                   # accuracy and train parts
    workloads: tuple[str, ...] = ("digits-cnn",)
    targets: dict[str, float] = field(default_factory=dict)  # workload name -> target
    bandwidths: tuple[str, ...] = ("100mbit", "1gbit")
    workers: int = 4
    epochs: int | None = None
    steps: dict[str, int] = field(default_factory=dict)      # workload name -> step limit
    eval_every: dict[str, int] = field(default_factory=dict)
    repeats: int = 1                                   # train part, interleaved
    seeds: int = 3
    accuracy_epochs: int = 8
    emulate_models: tuple[tuple[str, int], ...] = (("resnet50", 8), ("bert-large", 4))
    emulate_bandwidth: str = "10gbit"
    emulate_methods: tuple[Method, ...] = ()
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        bad = set(self.parts) - set(PARTS)
        if bad:
            raise ConfigError(f"unknown part(s) {sorted(bad)} (known: {', '.join(PARTS)})")
        if min(self.reps, self.repeats, self.seeds, self.accuracy_epochs) < 1 \
                or self.workers < 2:
            raise ConfigError("--reps, --repeats, --seeds, --accuracy-epochs must be >= 1, "
                              "--workers >= 2")
        if self.size_bytes < 4:
            raise ConfigError(f"--size must be at least 4 bytes, got {self.size_bytes}")
        for rate in self.bandwidths + (self.emulate_bandwidth,):
            parse_rate(rate)
        for w in self.workloads if {"accuracy", "train"} & set(self.parts) else ():
            if parse_spec(w).name not in self.targets:
                raise ConfigError(f"no --target for workload {parse_spec(w).name!r}")


# -- part 1: throughput --------------------------------------------------------------------

def throughput_rows(names: list[str], size_bytes: int, reps: int, world: int = 4,
                    progress: Progress = lambda _: None) -> list[dict[str, Any]]:
    """Compress + decompress one tensor of ``size_bytes`` per method (median of ``reps``)."""
    from dlcomm.compress import make_compressor
    from dlcomm.compress.api import wire_bytes

    numel = size_bytes // 4
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    rows = []
    for name in names:
        compressor = make_compressor(name)
        compressor.bind(0, world)
        compress_s, decompress_s = [], []
        for rep in range(reps + 1):                        # the first is a warm-up
            t0 = time.perf_counter()
            payload, ctx = compressor.compress(x, "bench")
            t1 = time.perf_counter()
            approx = compressor.decompress(payload, ctx)
            t2 = time.perf_counter()
            if rep:
                compress_s.append(t1 - t0)
                decompress_s.append(t2 - t1)
        payload_bytes = sum(t.numel() * t.element_size() for t in payload)
        c, d = statistics.median(compress_s), statistics.median(decompress_s)
        error = float(torch.linalg.vector_norm(approx - x) / torch.linalg.vector_norm(x))
        ring = wire_bytes(compressor, payload, world, native=True)
        switch = wire_bytes(compressor, payload, world, native=False)
        rows.append({
            "method": name, "summable": compressor.summable,
            "aggregation": "all-reduce" if compressor.summable else
            f"all-gather ({compressor.aggregation})",
            "size_bytes": numel * 4, "compress_s": c, "decompress_s": d,
            "throughput_MBps": numel * 4 / 1e6 / (c + d) if c + d > 1e-5 else None,
            "payload_bytes": payload_bytes, "compression_ratio": numel * 4 / payload_bytes,
            "ring_wire_bytes_per_element": ring / numel,
            "switch_wire_bytes_per_element": switch / numel if compressor.summable else None,
            "relative_error": error})
        r = rows[-1]
        speed = f"{r['throughput_MBps']:9.1f} MB/s" if r["throughput_MBps"] else "  no work"
        progress(f"{name:<12} {speed}  ratio {r['compression_ratio']:8.1f}  error {error:.3f}")
    return rows


# -- parts 2 and 3: training -----------------------------------------------------------------

def _train(workload: str, method: Method, seed: int, net: Any, place: Any, cfg: CompressionBench,
           path: Path, epochs: int | None) -> dict[str, Any]:
    from dlcomm.runtime.launcher import launch
    from dlcomm.train.config import TrainConfig

    name = parse_spec(workload).name
    job = TrainConfig(workload=workload, workers=cfg.workers, exchange="ring", epochs=epochs,
                      steps=cfg.steps.get(name), eval_every=cfg.eval_every.get(name, 0),
                      seed=seed, compress=method.compress, memory=method.memory, quiet=True,
                      json=str(path), timeout_s=cfg.timeout_s, master_addr=place.master_addr,
                      network=net.network, bandwidth=net.bandwidth,
                      extra={"network_info": place.info})
    launch(job.to_dict(), cfg.workers, place)
    return json.loads(path.read_text())


def _metric(doc: dict[str, Any]) -> str:
    return "accuracy" if "final_accuracy" in doc["summary"] else "perplexity"


def _train_row(workload: str, method: Method, doc: dict[str, Any], target: float
               ) -> dict[str, Any]:
    from dlcomm.bench.train import time_to_target

    s, metric = doc["summary"], _metric(doc)
    values = [e[metric] for e in doc["evals"]]
    exchange = doc["workers"][0].get("exchange", {})
    return {"workload": workload, "method": method.label, "compress": method.compress,
            "memory": method.memory, "metric": metric, "target": target,
            "time_to_target_s": time_to_target(doc["evals"], metric, target),
            f"final_{metric}": s[f"final_{metric}"],
            f"best_{metric}": (max if metric == "accuracy" else min)(values) if values else None,
            "time_per_step_s": s["time_per_step_s"],
            "comm_wait_per_step_s": s["comm_wait_per_step_s"],
            "bytes_sent_per_worker_per_step": s["bytes_sent_per_worker_per_step"],
            "gradient_bytes": s["gradient_bytes"], "steps": s["steps"],
            "traffic_ratio": exchange.get("traffic_ratio"),
            "adaptive_assignment": exchange.get("adaptive", {}).get("assignment"),
            "adaptive_decisions": exchange.get("adaptive", {}).get("decisions"),
            "adaptive_methods_per_step": [s["methods"] for s in exchange.get(
                "adaptive", {}).get("steps", [])],
            "evals": [{"time_s": e["time_s"], "step": e["step"], metric: e[metric]}
                      for e in doc["evals"]]}


def accuracy_rows(cfg: CompressionBench, progress: Progress) -> list[dict[str, Any]]:
    from dlcomm.emulate.placement import NetworkOptions
    from dlcomm.emulate.placement import placement

    rows = []
    net = NetworkOptions()
    with job_directory("bench-compress") as tmp, \
            placement(net, cfg.workers) as place:
        for workload in cfg.workloads:
            if parse_spec(workload).name != "digits-cnn":
                continue  # the accuracy check is the classification workload's
            for seed in range(cfg.seeds):
                for method in cfg.methods:
                    doc = _train(workload, method, seed, net, place, cfg,
                                 tmp / f"a{len(rows)}.json", cfg.accuracy_epochs)
                    row = _train_row(workload, method, doc, cfg.targets[parse_spec(
                        workload).name])
                    rows.append({**row, "seed": seed, "network": "loopback"})
                    progress(f"accuracy seed {seed} {method.label:<36} final "
                             f"{row['final_accuracy']:.2%} best {row['best_accuracy']:.2%}")
    return rows


def train_rows(cfg: CompressionBench, progress: Progress) -> list[dict[str, Any]]:
    from dlcomm.emulate.placement import NetworkOptions
    from dlcomm.emulate.placement import placement

    rows: list[dict[str, Any]] = []
    with job_directory("bench-compress") as tmp:
        for rate in cfg.bandwidths:
            net = NetworkOptions("emulated", rate)
            with placement(net, cfg.workers) as place:
                for workload in cfg.workloads:
                    name = parse_spec(workload).name
                    # methods interleaved within each repeat: drift hits all of them alike
                    for repeat, method in itertools.product(range(cfg.repeats), cfg.methods):
                        t0 = time.perf_counter()
                        doc = _train(workload, method, 0, net, place, cfg,
                                     tmp / f"t{len(rows)}.json", cfg.epochs)
                        row = {**_train_row(workload, method, doc, cfg.targets[name]),
                               "bandwidth": rate, "bandwidth_bps": parse_rate(rate),
                               "repeat": repeat}
                        rows.append(row)
                        tt = row["time_to_target_s"]
                        progress(f"{rate:>8} {name:<10} {method.label:<36} to target: "
                                 + (f"{tt:7.1f} s" if tt else "  never")
                                 + f"  {row['time_per_step_s'] * 1e3:7.1f} ms/step "
                                 f"({time.perf_counter() - t0:.0f} s)")
    return rows


# -- part 4: time-dilated emulation -------------------------------------------------------------

def emulate_rows(cfg: CompressionBench, progress: Progress) -> list[dict[str, Any]]:
    from dlcomm.emulate.dilation import EmulateConfig
    from dlcomm.emulate.emulation import run_emulation

    rows = []
    rate = parse_rate(cfg.emulate_bandwidth)
    methods = [Method("none")] + [m for m in cfg.emulate_methods if m.compress != "none"]
    specs = [m.exchange_spec() for m in methods]
    for model, workers in cfg.emulate_models:
        # warm-up 2: the exchange's keyed state settles and PowerSGD starts at iteration 2
        emu = EmulateConfig(model, workers, rate, iterations=2, warmup=2)
        t0 = time.perf_counter()
        result = run_emulation(emu, auto_dilation=True, exchanges=specs)
        for method, entry in zip(methods, result["results"]):
            stats = entry["exchange_stats"]
            compress_s = [w.get("compress_s", 0.0) for w in stats]
            rows.append({"model": model, "workers": workers, "bandwidth": cfg.emulate_bandwidth,
                         "method": method.label, "exchange": entry["exchange"],
                         "iteration_time_s": entry["iteration_time_s"],
                         "compute_s": entry["compute_s"],
                         "exposed_comm_s": entry["exposed_comm_s"],
                         "comm_busy_s": entry["comm_busy_s"],
                         "speedup_over_uncompressed":
                             result["results"][0]["iteration_time_s"] / entry["iteration_time_s"],
                         "dilation": entry["dilation"],
                         "compress_cpu_s_per_worker": statistics.fmean(compress_s),
                         "traffic_ratio": stats[0].get("traffic_ratio"),
                         "gradient_bytes": entry["gradient_bytes"]})
            progress(f"emulate {model} x{workers} {method.label:<36} "
                     f"{entry['iteration_time_s'] * 1e3:8.1f} ms/iteration "
                     f"({rows[-1]['speedup_over_uncompressed']:.2f}x)")
        progress(f"emulate {model}: {time.perf_counter() - t0:.0f} s")
    return rows


# -- the result ----------------------------------------------------------------------------------

def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeats of one method as one row: median time to target (a run that never got
    there counts as infinitely slow; None if most never did) and time per step."""
    reached = sorted(r["time_to_target_s"] or math.inf for r in runs)
    target = statistics.median(reached)
    return {"time_to_target_s": target if math.isfinite(target) else None,
            "time_per_step_s": statistics.median(r["time_per_step_s"] for r in runs),
            "runs": len(runs)}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers (docs/compression.md, "must show")."""
    out: dict[str, Any] = {}
    acc = result.get("accuracy") or []
    if acc:
        by: dict[str, list[dict[str, Any]]] = {}
        for r in acc:
            by.setdefault(r["method"], []).append(r)
        base = by.get("none", [])
        mean = {m: statistics.fmean(r["final_accuracy"] for r in rs) for m, rs in by.items()}
        best = {m: statistics.fmean(r["best_accuracy"] for r in rs) for m, rs in by.items()}
        out["accuracy"] = {
            "mean_final_accuracy": mean, "mean_best_accuracy": best,
            "final_points_below_uncompressed": {m: 100 * (mean["none"] - v)
                                                for m, v in mean.items()} if base else None}
    train = result.get("train") or []
    if train:
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for r in train:
            key = f"{parse_spec(r['workload']).name}@{r['bandwidth']}"
            runs.setdefault(key, {}).setdefault(r["method"], []).append(r)
        table = {key: {m: _median_run(rs) for m, rs in methods.items()}
                 for key, methods in runs.items()}
        speed: dict[str, Any] = {}
        for key, rows in table.items():
            none = rows.get("none", {}).get("time_to_target_s")
            fp16 = rows.get("fp16", {}).get("time_to_target_s")
            times = {m: r["time_to_target_s"] for m, r in rows.items()}
            reached = {m: t for m, t in times.items() if t}
            best = min(reached, key=lambda m: reached[m]) if reached else None
            speed[key] = {
                "runs": {m: r["runs"] for m, r in rows.items()},
                "time_to_target_s": times,
                "speedup_over_uncompressed": {m: _ratio(none, t) for m, t in times.items()},
                "speedup_over_fp16": {m: _ratio(fp16, t) for m, t in times.items()},
                "best_method": best,
                "best_speedup_over_uncompressed": _ratio(none, reached.get(best)) if best else None,
                "time_per_step_over_uncompressed": {
                    m: _ratio(r["time_per_step_s"], rows.get("none", {}).get("time_per_step_s"))
                    for m, r in rows.items()}}
        out["time_to_target"] = speed
        fastest = max(r["bandwidth_bps"] for r in train)
        adaptive = {k: v for k, v in speed.items() if "adaptive" in v["time_to_target_s"]
                    and k.endswith(next(r["bandwidth"] for r in train
                                        if r["bandwidth_bps"] == fastest))}
        out["adaptive_at_fastest_rate"] = {
            k: {"time_to_target_over_uncompressed": _ratio(v["time_to_target_s"]["adaptive"],
                                                           v["time_to_target_s"].get("none")),
                "time_per_step_over_uncompressed":
                    v["time_per_step_over_uncompressed"].get("adaptive")}
            for k, v in adaptive.items()}
    emu = result.get("emulate") or []
    if emu:
        out["emulate_speedup_over_uncompressed"] = {
            f"{r['model']}@{r['bandwidth']}": {} for r in emu}
        for r in emu:
            out["emulate_speedup_over_uncompressed"][f"{r['model']}@{r['bandwidth']}"][
                r["method"]] = r["speedup_over_uncompressed"]
    thr = result.get("throughput") or []
    if thr:
        out["throughput_MBps"] = {r["method"]: r["throughput_MBps"] for r in thr}  # None: no work
        out["compression_ratio"] = {r["method"]: r["compression_ratio"] for r in thr}
    return out


def run_compression_bench(cfg: CompressionBench, progress: Progress = lambda _: None
                          ) -> dict[str, Any]:
    """Run the selected parts and return the ``bench-compression`` result."""
    start = time.perf_counter()
    config = asdict(cfg)
    config["methods"] = [m.label for m in cfg.methods]
    config["emulate_methods"] = [m.label for m in cfg.emulate_methods]
    result = new_result("bench-compression", config)
    if "throughput" in cfg.parts:
        names = list(cfg.throughput_methods) or DEFAULT_THROUGHPUT
        result["throughput"] = throughput_rows(names, cfg.size_bytes, cfg.reps, cfg.workers,
                                               progress)
    if "accuracy" in cfg.parts:
        result["accuracy"] = accuracy_rows(cfg, progress)
    if "train" in cfg.parts:
        result["train"] = train_rows(cfg, progress)
    if "emulate" in cfg.parts:
        result["emulate"] = emulate_rows(cfg, progress)
    result["summary"] = {**summarize(result), "wall_time_s": time.perf_counter() - start}
    return result


def print_compression_tables(result: dict[str, Any], json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if result.get("throughput"):
        t = Table("method", "MB/s", "ratio", "ring B/elem", "switch B/elem", "rel. error",
                  "exchange", title="compress + decompress, one CPU thread pool",
                  title_justify="left")
        for r in result["throughput"]:
            sw = r["switch_wire_bytes_per_element"]
            mbps = r["throughput_MBps"]
            t.add_row(r["method"], f"{mbps:.0f}" if mbps else "no work",
                      f"{r['compression_ratio']:.1f}",
                      f"{r['ring_wire_bytes_per_element']:.3f}",
                      f"{sw:.3f}" if sw is not None else "-", f"{r['relative_error']:.3f}",
                      r["aggregation"])
        console.print(t)
    s = result["summary"]
    if "accuracy" in s:
        t = Table("method", "mean final accuracy", "mean best", "points below none",
                  title="accuracy (loopback, seeds averaged)", title_justify="left")
        below = s["accuracy"]["final_points_below_uncompressed"] or {}
        for m, v in s["accuracy"]["mean_final_accuracy"].items():
            t.add_row(m, f"{v:.2%}", f"{s['accuracy']['mean_best_accuracy'][m]:.2%}",
                      f"{below.get(m, 0):+.2f}")
        console.print(t)
    for key, v in (s.get("time_to_target") or {}).items():
        t = Table("method", "time to target", "vs none", "vs fp16", "step time vs none",
                  title=f"time to target: {key}" + (
                      f" (median of {max(v['runs'].values())} runs)"
                      if max(v.get("runs", {"": 1}).values()) > 1 else ""),
                  title_justify="left")
        for m, tt in v["time_to_target_s"].items():
            a, b = v["speedup_over_uncompressed"][m], v["speedup_over_fp16"][m]
            c = v["time_per_step_over_uncompressed"][m]
            t.add_row(m, f"{tt:.1f} s" if tt else "never", f"{a:.2f}x" if a else "-",
                      f"{b:.2f}x" if b else "-", f"{c:.2f}" if c else "-")
        console.print(t)
    for key, v in (s.get("emulate_speedup_over_uncompressed") or {}).items():
        console.print(f"emulated {key}: " + ", ".join(f"{m} {x:.2f}x" for m, x in v.items()))
    if json_path:
        console.print(f"JSON result: {json_path}")


def plot_compression(result: dict[str, Any], path: str | Path) -> Path:
    """Throughput and ratio per method; time to target per rate; emulated speedups."""
    from dlcomm.plots import pyplot
    plt = pyplot()

    panels = [p for p in ("throughput", "train", "emulate") if result.get(p)]
    if not panels:
        raise ConfigError("nothing to plot: the result has no throughput, train or emulate part")
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, part in zip(axes[0], panels):
        if part == "throughput":
            rows = [r for r in result["throughput"] if r["throughput_MBps"]]
            names = [r["method"] for r in rows]
            ax.bar(names, [r["throughput_MBps"] for r in rows], color="C0")
            ax.set_yscale("log")
            ax.set_ylabel("compress + decompress (MB/s)")
            for i, r in enumerate(rows):
                ax.annotate(f"{r['compression_ratio']:.0f}x", (i, r["throughput_MBps"]),
                            ha="center", va="bottom", fontsize=7)
            ax.set_title(f"{rows[0]['size_bytes'] / 1e6:.0f} MB tensor (label: ratio)")
            ax.tick_params(axis="x", rotation=70)
        elif part == "train":
            table = result["summary"]["time_to_target"]
            keys = list(table)
            methods = list(dict.fromkeys(m for v in table.values() for m in v["time_to_target_s"]))
            width = 0.8 / max(len(methods), 1)
            for j, m in enumerate(methods):
                ys = [table[k]["time_to_target_s"].get(m) or 0 for k in keys]
                ax.bar([i + j * width for i in range(len(keys))], ys, width, label=m)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], keys, rotation=15)
            ax.set_ylabel("wall time to target (s); 0 = never")
            ax.legend(fontsize=7)
            ax.set_title("time to target per workload@rate")
        else:
            rows = result["emulate"]
            labels = [f"{r['model']}\n{r['method']}" for r in rows]
            ax.bar(range(len(rows)), [r["speedup_over_uncompressed"] for r in rows], color="C2")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xticks(range(len(rows)), labels, rotation=70, fontsize=7)
            ax.set_ylabel("iteration speedup over uncompressed")
            ax.set_title(f"time-dilated emulation at {rows[0]['bandwidth']}")
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return save_figure(fig, path)
