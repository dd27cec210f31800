"""Hop on torch.distributed processes: the thin loop around :class:`~.hop.HopWorker`.

Channels (point-to-point over the default gloo group, :class:`~.p2p.Mailbox`):

- ``UPDATE`` j -> i for every edge j -> i: float32 ``[tag (int64 in 2 slots), model...]``;
  tag -1 closes the channel;
- ``CONTROL`` j -> i for every neighbour pair: int64 ``[kind, completed]``, kind TOKEN (j
  has completed that many iterations) or FINISH (j stopped; closes the channel).

Each iteration follows :mod:`.hop`: wait for tokens (maybe skip), send the model tagged k,
compute the gradient (the emulated compute of ``--compute-ms``/``--straggler`` included),
wait for the in-neighbours' updates, average, apply the optimizer step, send tokens.
"""

from __future__ import annotations

import torch

from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.common import Learner
from dlcomm.train.config import TrainConfig
from dlcomm.train.sync.graphs import Graph
from dlcomm.train.sync.hop import HopOptions, HopWorker
from dlcomm.train.sync.p2p import Mailbox
from dlcomm.train.sync.recorder import Recorder

__all__ = ["run_hop", "mean_of"]

TAG_UPDATE, TAG_CONTROL = 101, 102
TOKEN, FINISH = 1, 2


def _update(tag: int, model: torch.Tensor | None, numel: int) -> torch.Tensor:
    buf = torch.empty(numel + 2)
    buf[:2].view(torch.int64)[0] = tag
    if model is None:
        buf[2:] = 0
    else:
        buf[2:] = model
    return buf


def mean_of(x: torch.Tensor, others: list[torch.Tensor]) -> torch.Tensor:
    """(x + sum(others)) / (1 + len(others)): uniform weights over what arrived."""
    out = x.clone()
    for other in others:
        out.add_(other)
    return out.div_(1 + len(others))


class _HopRun:
    """One worker's Hop: its state machine, its mailbox and the iteration loop's phases."""

    def __init__(self, cfg: TrainConfig, env: WorkerEnv, learner: Learner, graph: Graph,
                 options: HopOptions) -> None:
        rank = env.rank
        self.learner, self.n = learner, learner.numel
        self.state: HopWorker[torch.Tensor] = HopWorker(rank, graph.in_neighbours(rank),
                                                        graph.out_neighbours(rank), options)
        self.mail = Mailbox(rank, cfg.timeout_s, "hop")
        self.phases = {"tokens_s": 0.0, "compute_s": 0.0, "updates_s": 0.0, "mix_s": 0.0}
        for j in self.state.in_neighbours:
            self.mail.listen(j, TAG_UPDATE, self.n + 2, torch.float32, self._on_update)
        for j in self.state.neighbours:
            self.mail.listen(j, TAG_CONTROL, 2, torch.int64, self._on_control)

    # -- messages in (the mailbox's threads) ------------------------------------------
    def _on_update(self, src: int, buf: torch.Tensor) -> bool:
        tag = int(buf[:2].view(torch.int64)[0])
        if tag < 0:
            return True
        self.state.on_update(src, tag, buf[2:])
        return False

    def _on_control(self, src: int, buf: torch.Tensor) -> bool:
        kind, completed = int(buf[0]), int(buf[1])
        if kind == TOKEN:
            self.state.on_token(src, completed)
            return False
        self.state.on_finish(src, completed)
        return True

    # -- messages out -------------------------------------------------------------------
    def _control(self, kind: int, value: int) -> None:
        for j in self.state.neighbours:
            self.mail.send(j, TAG_CONTROL, torch.tensor([kind, value], dtype=torch.int64))

    def _lagging_tokens(self) -> str:
        late = [j for j in self.state.active if self.state.tokens(j) < 1]
        return f"tokens for iteration {self.state.completed} from ranks {late}"

    def _missing_updates(self) -> str:
        return (f"updates of iteration {self.state.current} from ranks "
                f"{[j for j in self.state.in_neighbours if j not in self.state.finished]}")

    # -- the loop -------------------------------------------------------------------------
    def iteration(self, recorder: Recorder) -> bool:
        """One Hop iteration (hop.py's steps 1-6); True once the run should stop."""
        state, mail, learner, phases = self.state, self.mail, self.learner, self.phases
        t0 = recorder.now()
        start = mail.wait_for(state.try_start, self._lagging_tokens)
        waited = recorder.now() - t0
        phases["tokens_s"] += waited
        x = learner.vector()
        if start.skipped:
            with mail.cond:
                self._control(TOKEN, state.completed)  # repay the skipped iterations' tokens
            if start.catch_up:
                x = mean_of(x, list(start.catch_up.values()))
                learner.load(x)
        update = _update(start.iteration, x, self.n)
        for j in state.out_neighbours:
            mail.send(j, TAG_UPDATE, update)
        t_compute = recorder.now()
        loss = learner.gradient()
        t_wait = recorder.now()
        chosen = mail.wait_for(state.ready_updates, self._missing_updates)
        t_mix = recorder.now()
        phases["compute_s"] += t_wait - t_compute
        phases["updates_s"] += t_mix - t_wait
        waited += t_mix - t_wait
        if chosen:
            learner.load(mean_of(x, list(chosen.values())))  # weights renormalised
        learner.apply()
        with mail.cond:
            self._control(TOKEN, state.complete())
            stop = learner.steps >= learner.total or state.stop_requested
        phases["mix_s"] += recorder.now() - t_mix
        recorder.step(learner, loss, t0, waited, mail.counters())
        return stop

    def finish(self) -> None:
        """Tell the neighbours, close the update channels, wait for theirs."""
        with self.mail.cond:
            self._control(FINISH, self.state.completed)
        for j in self.state.out_neighbours:
            self.mail.send(j, TAG_UPDATE, _update(-1, None, self.n))
        self.mail.join("every neighbour to finish")

    def stats(self, graph: Graph, options: HopOptions) -> dict[str, object]:
        state = self.state
        return {"graph": graph.name, "max_gap": options.max_gap, "backup": options.backup,
                "staleness": options.staleness, "skip": options.skip,
                "reuse": options.reuse, "skipped_iterations": state.skipped_iterations,
                "jumps": state.jumps, "partial_iterations": state.partial_iterations,
                "already_used": state.already_used,
                **{k: round(v, 4) for k, v in self.phases.items()}}


def run_hop(cfg: TrainConfig, env: WorkerEnv, learner: Learner, recorder: Recorder,
            graph: Graph, options: HopOptions) -> int:
    """Train this worker with Hop until it or a neighbour finishes; returns iterations."""
    run = _HopRun(cfg, env, learner, graph, options)
    recorder.start_together(learner)
    while not run.iteration(recorder):
        pass
    run.finish()
    recorder.report.gaps = {str(j): g for j, g in run.state.max_gap_seen.items()}
    recorder.report.stats = run.stats(graph, options)
    return run.state.completed
