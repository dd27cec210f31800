"""What every way of training shares (BSP and the decentralized protocols of ``sync/``).

- :class:`Learner`: one worker's model, optimizer, data stream (the same DistributedSampler
  shard per rank for every protocol), emulated compute and stragglers between forward and
  backward, and fault injection, so that every protocol sees the same work;
- :class:`StepRecord` and :class:`WorkerReport`: what a worker measured, gathered by rank 0
  into the train result (:mod:`.report`);
- :class:`Progress`: the progress bar on rank 0;
- :func:`evaluate`: the model on this worker's shard of the test set, summed over workers.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DataLoader, DistributedSampler, Subset

from dlcomm.errors import ConfigError
from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.config import Fault, TrainConfig, parse_fault
from dlcomm.train.hetero import parse_straggler, slowdown, step_delay
from dlcomm.workloads import Workload, finish_metrics

__all__ = ["Learner", "StepRecord", "WorkerReport", "Progress", "evaluate", "make_optimizer",
           "inject_fault"]


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


def make_optimizer(workload: Workload, params: Iterable[torch.nn.Parameter],
                   lr: float) -> torch.optim.Optimizer:
    """The workload's optimizer: SGD with momentum 0.9, or Adam."""
    if workload.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.Adam(params, lr=lr)


def inject_fault(fault: Fault | None, rank: int, step: int) -> None:
    """``--fault RANK:STEP:KIND``: raise, exit, be killed or hang at that step."""
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


class Progress:
    """A rich progress bar on rank 0 (stderr), silent elsewhere."""

    def __init__(self, enabled: bool, total: int, title: str) -> None:
        self._bar: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
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


class Learner:
    """One worker's model, optimizer, data stream and emulated compute."""

    def __init__(self, cfg: TrainConfig, env: WorkerEnv, workload: Workload) -> None:
        self.cfg, self.env, self.workload = cfg, env, workload
        self.model = workload.model
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.optimizer = make_optimizer(workload, self.params, cfg.lr or workload.lr)
        self.sampler: DistributedSampler[Any] = DistributedSampler(
            workload.train_set, num_replicas=env.world_size, rank=env.rank, shuffle=True,
            seed=cfg.seed, drop_last=True)
        self.loader = DataLoader(workload.train_set,
                                 batch_size=cfg.batch_size or workload.batch_size,
                                 sampler=self.sampler, drop_last=True)
        self.per_epoch = len(self.loader)
        if self.per_epoch == 0:
            raise ConfigError(f"batch size {self.loader.batch_size} x {env.world_size} workers "
                              f"exceeds the {len(workload.train_set)} training examples of "
                              f"{workload.name}")
        if cfg.steps is not None and cfg.epochs is None:
            self.total = cfg.steps
        else:
            self.total = min((cfg.epochs or workload.default_epochs) * self.per_epoch,
                             cfg.steps or 2**62)
        self.straggler = parse_straggler(cfg.straggler) if cfg.straggler else None
        self.slow_rng = random.Random(cfg.seed * 1_000_003 + env.rank)
        self.fault = parse_fault(cfg.fault) if cfg.fault else None
        self.steps = 0
        self.started_at = 0.0   # perf_counter() when the last gradient's forward began
        self._batches: Iterator[Any] = iter(())
        self._epoch = -1

    @property
    def epoch(self) -> int:
        return max(self._epoch, 0)

    def _next_batch(self) -> Any:
        while True:
            try:
                return next(self._batches)
            except StopIteration:
                self._epoch += 1
                self.sampler.set_epoch(self._epoch)
                self._batches = iter(self.loader)

    def gradient(self, module: torch.nn.Module | None = None) -> float:
        """Forward, emulated compute, backward on ``module`` (default: the model; BSP passes
        its DDP wrapper); returns the loss. Gradients land in ``module``'s parameters."""
        module = module or self.model
        inject_fault(self.fault, self.env.rank, self.steps)
        x, y = self._next_batch()
        t0 = self.started_at = time.perf_counter()
        loss = self.workload.loss(module(x), y)
        delay = step_delay(self.cfg.compute_ms, 3 * (time.perf_counter() - t0),
                           slowdown(self.straggler, self.env.rank, self.slow_rng))
        if delay > 0:  # emulated compute, before backward starts the exchange
            time.sleep(delay)
        module.zero_grad(set_to_none=True)
        loss.backward()
        self.steps += 1
        return float(loss.item())

    def vector(self) -> torch.Tensor:
        """A copy of the parameters as one flat float32 tensor."""
        with torch.no_grad():
            return parameters_to_vector(self.params).detach().clone()

    def load(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            vector_to_parameters(flat, self.params)

    def apply(self) -> None:
        """The optimizer step with the gradients in the model's parameters."""
        self.optimizer.step()
