"""The training loop: DDP over gloo with gradients averaged through a dlcomm exchange.

Launch: ``dlcomm train --workload digits-cnn --workers 4 --exchange ring`` (this host), or
``torchrun --nproc-per-node 4 -m dlcomm worker --workload digits-cnn`` (any launcher).

One step: forward -> loss.backward() (DDP hands each gradient bucket to our comm hook, which
calls ``exchange.allreduce``) -> optimizer step. Per step we record the wall time, the time
backward waited on communication after the last bucket was handed over, and the bytes the
exchange moved. Evaluation shards the test set over workers and sums the results.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from dlcomm.errors import ConfigError
from dlcomm.exchange import ExchangeContext, ExchangeHookState, exchange_hook, make_exchange
from dlcomm.train.config import Fault, TrainConfig, parse_fault
from dlcomm.train.hetero import parse_straggler, slowdown, step_delay
from dlcomm.runtime.env import WorkerEnv, wire_bytes
from dlcomm.workloads import Workload, finish_metrics, make_workload

__all__ = ["train", "StepRecord", "WorkerReport"]


@dataclass
class StepRecord:
    step: int
    epoch: int
    time_s: float        # since training started
    loss: float          # this worker's training loss of the step
    step_time_s: float
    comm_wait_s: float   # backward's wait for communication after the last bucket
    bytes_sent: int
    bytes_received: int
    block_density: float = 0.0  # fraction of 256-element gradient blocks with data


@dataclass
class WorkerReport:
    """What one worker measured; rank 0 gathers these into the result."""

    rank: int
    steps: list[StepRecord] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    exchange: dict[str, Any] = field(default_factory=dict)
    wire: dict[str, int] | None = None  # kernel interface bytes during training (emulated)

    def summary(self) -> dict[str, Any]:
        n = max(len(self.steps), 1)
        return {"rank": self.rank, "steps": len(self.steps),
                "time_per_step_s": sum(s.step_time_s for s in self.steps) / n,
                "comm_wait_per_step_s": sum(s.comm_wait_s for s in self.steps) / n,
                "bytes_sent": sum(s.bytes_sent for s in self.steps),
                "bytes_received": sum(s.bytes_received for s in self.steps),
                "exchange": self.exchange, "wire": self.wire}


def _make_optimizer(workload: Workload, params: Any, lr: float) -> torch.optim.Optimizer:
    if workload.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.Adam(params, lr=lr)


def _inject(fault: Fault | None, rank: int, step: int) -> None:
    if fault is None or fault.rank != rank or fault.step != step:
        return
    if fault.kind == "raise":
        raise RuntimeError(f"injected fault at step {step}")
    if fault.kind == "exit":
        os._exit(3)
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # "hang"
        time.sleep(3600)


def evaluate(model: torch.nn.Module, workload: Workload, env: WorkerEnv) -> dict[str, float]:
    """Score ``model`` on this worker's shard of the test set, summed over all workers."""
    shard = Subset(workload.test_set, range(env.rank, len(workload.test_set), env.world_size))
    sums = torch.zeros(3, dtype=torch.float64)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(shard, batch_size=256):
            sums += workload.eval_sums(model(x), y)
    model.train(was_training)
    if env.world_size > 1:
        dist.all_reduce(sums)
    return finish_metrics(workload.metric, sums)


class _Progress:
    """A rich progress bar on rank 0 (stderr), silent elsewhere."""

    def __init__(self, enabled: bool, total: int, title: str) -> None:
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=Console(stderr=True))
            self._task = self._bar.add_task(title, total=total, info="")
            self._bar.start()

    def advance(self, info: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=info)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def train(cfg: TrainConfig, env: WorkerEnv) -> tuple[Workload, list[WorkerReport] | None]:
    """Train ``cfg.workload`` on this worker; rank 0 gets every worker's report."""
    if cfg.sync != "bsp":
        from dlcomm.train.sync import train_decentralized
        return train_decentralized(cfg, env)
    fault = parse_fault(cfg.fault) if cfg.fault else None
    straggler = parse_straggler(cfg.straggler) if cfg.straggler else None
    slow_rng = random.Random(cfg.seed * 1_000_003 + env.rank)
    workload = make_workload(cfg.workload, seed=cfg.seed)
    model = DistributedDataParallel(workload.model)
    exchange = make_exchange(cfg.exchange, ExchangeContext(env.rank, env.world_size))
    if cfg.compress != "none" or cfg.memory != "none":
        from dlcomm.exchange.compressed import compressed_exchange
        exchange = compressed_exchange(exchange, cfg.compress, cfg.memory,
                                       ExchangeContext(env.rank, env.world_size))
    hook_state = ExchangeHookState(exchange, env.world_size)
    model.register_comm_hook(hook_state, exchange_hook)
    optimizer = _make_optimizer(workload, model.parameters(), cfg.lr or workload.lr)

    sampler = DistributedSampler(workload.train_set, num_replicas=env.world_size,
                                 rank=env.rank, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(workload.train_set, batch_size=cfg.batch_size or workload.batch_size,
                        sampler=sampler, drop_last=True)
    per_epoch = len(loader)
    if per_epoch == 0:
        raise ConfigError(f"batch size {loader.batch_size} x {env.world_size} workers exceeds "
                          f"the {len(workload.train_set)} training examples of {workload.name}")
    if cfg.steps is not None and cfg.epochs is None:
        total = cfg.steps
    else:
        total = min((cfg.epochs or workload.default_epochs) * per_epoch, cfg.steps or 2**62)
    epochs = -(-total // per_epoch)
    report = WorkerReport(env.rank)
    progress = _Progress(env.rank == 0 and not cfg.quiet, total,
                         f"{workload.name} x{env.world_size} {cfg.exchange}")
    wire_start = wire_bytes()
    start = time.perf_counter()
    step = 0
    try:
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                if step >= total:
                    break
                _inject(fault, env.rank, step)
                before = exchange.stats()
                t0 = time.perf_counter()
                hook_state.reset_step()
                loss = workload.loss(model(x), y)
                delay = step_delay(cfg.compute_ms, 3 * (time.perf_counter() - t0),
                                   slowdown(straggler, env.rank, slow_rng))
                if delay > 0:  # emulated compute, before backward starts the exchange
                    time.sleep(delay)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                t_backward = time.perf_counter()
                optimizer.step()
                t1 = time.perf_counter()
                after = exchange.stats()
                wait = t_backward - hook_state.last_call if hook_state.buckets else 0.0
                report.steps.append(StepRecord(
                    step, epoch, t1 - start, loss.item(), t1 - t0, max(wait, 0.0),
                    after.bytes_sent - before.bytes_sent,
                    after.bytes_received - before.bytes_received, hook_state.block_density))
                step += 1
                last_of_epoch = step % per_epoch == 0
                if (cfg.eval_every and step % cfg.eval_every == 0) or (
                        not cfg.eval_every and last_of_epoch) or step == total:
                    metrics = evaluate(model.module, workload, env)
                    report.evals.append({"step": step, "epoch": epoch,
                                         "time_s": time.perf_counter() - start, **metrics})
                progress.advance(_progress_info(report.steps[-1].loss, report.evals, workload.metric))
    finally:
        progress.close()
        report.exchange = exchange.stats().as_dict()
        exchange.close()
        wire_end = wire_bytes()
        if wire_start and wire_end:
            report.wire = {k: wire_end[k] - wire_start[k] for k in wire_end}
    gathered: list[WorkerReport | None] = [None] * env.world_size
    if env.world_size > 1:
        dist.gather_object(report, gathered if env.rank == 0 else None, dst=0)
    else:
        gathered = [report]
    return workload, ([r for r in gathered if r is not None] if env.rank == 0 else None)


def _progress_info(loss: float, evals: list[dict[str, float]], metric: str) -> str:
    text = f"loss {loss:.3g}"
    if evals and metric in evals[-1]:
        text += f"  {metric} {evals[-1][metric]:.4g}"
    return text
