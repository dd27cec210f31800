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

The headline numbers, the tables and the plot of a result: ``compression_report.py``.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dlcomm.bench import JOB_DEADLINE_S
from dlcomm.bench.compression_report import (
    plot_compression,
    print_compression_tables,
    summarize,
)
from dlcomm.errors import ConfigError
from dlcomm.registry import parse_rate, parse_spec
from dlcomm.results import new_result
from dlcomm.runtime.jobdir import job_directory

# summarize, print_compression_tables and plot_compression live in compression_report.py;
# they stay importable from here
__all__ = ["Method", "parse_methods", "CompressionBench", "run_compression_bench",
           "throughput_rows", "print_compression_tables", "plot_compression", "PARTS",
           "summarize"]

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
    launch(job.to_dict(), cfg.workers, place, deadline_s=JOB_DEADLINE_S)
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
    from dlcomm.emulate.placement import NetworkOptions, placement

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
    from dlcomm.emulate.placement import NetworkOptions, placement

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
