"""``bsp``: bulk-synchronous training, the baseline: DDP over gloo, every step's gradients
averaged through a dlcomm exchange (any of ``--exchange``, optionally compressed).

One step: forward -> loss.backward() (DDP hands each gradient bucket to the exchange hook,
which calls ``exchange.allreduce``) -> optimizer step. Per step it records the wall time,
the time backward waited on communication after the last bucket was handed over, the bytes
the exchange moved and the gradients' block density. Evaluation shards the test set over
workers and sums the results, every ``--eval-every`` steps (else after every epoch) and at
the end.

With ``--backend dlcomm`` the process group itself is the exchange (the c10d backend,
docs/torch.md): DDP runs with no comm hook at all, as in a user's own script, and the
step records take the backend's exchange counters; the communication wait is not seen
(no hook sees the buckets), so it is recorded as 0.
"""

from __future__ import annotations

import time

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlcomm.exchange import (
    Exchange,
    ExchangeContext,
    ExchangeHookState,
    ExchangeStats,
    exchange_hook,
    make_exchange,
)
from dlcomm.registry import reject_unknown
from dlcomm.runtime.env import WorkerEnv, wire_bytes
from dlcomm.runtime.failures import report_failure
from dlcomm.train.common import Learner, Progress, StepRecord, WorkerReport, evaluate
from dlcomm.train.config import TrainConfig
from dlcomm.train.sync.base import SYNCS, Protocol
from dlcomm.workloads import Workload

__all__ = ["BSP", "build_exchange"]


def build_exchange(cfg: TrainConfig, env: WorkerEnv) -> Exchange:
    """``--exchange``, wrapped with ``--compress``/``--memory`` if either is set."""
    ctx = ExchangeContext(env.rank, env.world_size)
    exchange = make_exchange(cfg.exchange, ctx)
    if cfg.compress != "none" or cfg.memory != "none":
        from dlcomm.exchange.compressed import compressed_exchange
        exchange = compressed_exchange(exchange, cfg.compress, cfg.memory, ctx)
    return exchange


class _BackendExchange:
    """The dlcomm backend's exchange as the loop sees it: counters; closed with the group."""

    def __init__(self) -> None:
        from dlcomm.torch.backend import exchange_of
        self.group = exchange_of()

    def stats(self) -> ExchangeStats:
        inner = self.group.exchange
        return inner.stats() if inner is not None else ExchangeStats("modelled")

    def close(self) -> None:
        """Nothing: ``destroy_process_group`` closes the backend's exchange."""


def _progress_info(loss: float, evals: list[dict[str, float]], metric: str) -> str:
    text = f"loss {loss:.3g}"
    if evals and metric in evals[-1]:
        text += f"  {metric} {evals[-1][metric]:.4g}"
    return text


@SYNCS.register("bsp", "bulk-synchronous DDP, gradients through --exchange (the baseline)")
class BSP(Protocol):
    name = "bsp"

    def __init__(self, **options: str) -> None:
        reject_unknown(dict(options), "sync 'bsp'")

    def check(self, world: int) -> None:
        """Any number of workers."""

    def train(self, cfg: TrainConfig, env: WorkerEnv, workload: Workload
              ) -> list[WorkerReport] | None:
        learner = Learner(cfg, env, workload)
        model = DistributedDataParallel(workload.model)
        exchange: Exchange | _BackendExchange
        hook: ExchangeHookState | None = None
        if cfg.backend == "dlcomm":
            exchange = _BackendExchange()
        else:
            exchange = build_exchange(cfg, env)
            hook = ExchangeHookState(exchange, env.world_size)
            model.register_comm_hook(hook, exchange_hook)
        report = WorkerReport(env.rank)
        progress = Progress(env.rank == 0 and not cfg.quiet, learner.total,
                            f"{workload.name} x{env.world_size} {cfg.exchange}")
        wire_start = wire_bytes()
        try:
            self._loop(cfg, env, learner, model, exchange, hook, report, progress)
        except BaseException as exc:
            report_failure(exc)  # before the exchange's sockets close (runtime.failures)
            raise
        finally:
            progress.close()
            report.exchange = exchange.stats().as_dict()
            exchange.close()
            wire_end = wire_bytes()
            if wire_start and wire_end:
                report.wire = {k: wire_end[k] - wire_start[k] for k in wire_end}
        if env.world_size == 1:
            return [report]
        gathered: list[WorkerReport | None] = [None] * env.world_size
        dist.gather_object(report, gathered if env.rank == 0 else None, dst=0)
        return [r for r in gathered if r is not None] if env.rank == 0 else None

    @staticmethod
    def _loop(cfg: TrainConfig, env: WorkerEnv, learner: Learner,
              model: DistributedDataParallel, exchange: Exchange | _BackendExchange,
              hook: ExchangeHookState | None, report: WorkerReport, progress: Progress) -> None:
        workload = learner.workload
        start = time.perf_counter()
        while learner.steps < learner.total:
            before = exchange.stats()
            if hook is not None:
                hook.reset_step()
            loss = learner.gradient(model)
            t_backward = time.perf_counter()
            learner.apply()
            t1 = time.perf_counter()
            after = exchange.stats()
            wait = t_backward - hook.last_call if hook is not None and hook.buckets else 0.0
            step = learner.steps
            report.steps.append(StepRecord(
                step - 1, learner.epoch, t1 - start, loss, t1 - learner.started_at,
                max(wait, 0.0), after.bytes_sent - before.bytes_sent,
                after.bytes_received - before.bytes_received,
                hook.block_density if hook is not None else 0.0))
            if (cfg.eval_every and step % cfg.eval_every == 0) or (
                    not cfg.eval_every and step % learner.per_epoch == 0) or \
                    step == learner.total:
                metrics = evaluate(model.module, workload, env)
                report.evals.append({"step": step, "epoch": learner.epoch,
                                     "time_s": time.perf_counter() - start, **metrics})
            progress.advance(_progress_info(loss, report.evals, workload.metric))
