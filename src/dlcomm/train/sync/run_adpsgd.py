"""AD-PSGD on torch.distributed processes: the thin loops around :mod:`.adpsgd`.

Messages are float32 ``[header (4 x int64 in 8 slots), model...]`` with header
``[kind, sender, sender's steps, end flag]``:

- REQUEST active -> passive (tag 201): the active's model; the passive's server thread
  (an any-source receive) replies and averages under the model lock;
- REPLY passive -> active (tag 202): the passive's model before averaging, and the end
  flag once the passive has finished;
- END active -> passive (tag 201): the active has stopped (no model).

A passive worker's authoritative model is its module's parameters, guarded by the
mailbox's condition; it computes each gradient on a private copy of the model, so that
averaging may run while its forward/backward does.
"""

from __future__ import annotations

import copy
import random

import torch

from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.common import Learner
from dlcomm.train.config import TrainConfig
from dlcomm.train.sync.adpsgd import PassiveBook, Roles
from dlcomm.train.sync.p2p import Mailbox
from dlcomm.train.sync.recorder import Recorder

__all__ = ["run_adpsgd"]

TAG_REQUEST, TAG_REPLY = 201, 202
REQUEST, REPLY, END = 1, 2, 3
HEADER = 8  # float32 slots = 4 int64


def _message(kind: int, rank: int, steps: int, flag: int, model: torch.Tensor | None,
             numel: int) -> torch.Tensor:
    buf = torch.zeros(numel + HEADER)
    buf[:HEADER].view(torch.int64)[:] = torch.tensor([kind, rank, steps, flag])
    if model is not None:
        buf[HEADER:] = model
    return buf


def _header(buf: torch.Tensor) -> tuple[int, int, int, int]:
    kind, rank, steps, flag = (int(v) for v in buf[:HEADER].view(torch.int64))
    return kind, rank, steps, flag


def run_adpsgd(cfg: TrainConfig, env: WorkerEnv, learner: Learner, recorder: Recorder,
               roles: Roles) -> int:
    """Train this worker with AD-PSGD until the run ends; returns its steps."""
    if roles.is_active(env.rank):
        return _active(cfg, env, learner, recorder, roles)
    return _passive(cfg, env, learner, recorder, roles)


def _active(cfg: TrainConfig, env: WorkerEnv, learner: Learner, recorder: Recorder,
            roles: Roles) -> int:
    rank, n = env.rank, learner.numel
    mail = Mailbox(rank, cfg.timeout_s, "adpsgd")
    rng = random.Random(cfg.seed * 7_919 + rank)
    max_gap = exchanges = 0
    stop = False
    while not stop:
        t0 = recorder.now()
        partner = roles.choose(rank, rng)
        x = learner.vector()
        # the averaging runs while the gradient at x is computed (x itself is not changed
        # until both are done); then x <- (x_i + x_j) / 2 - lr * step(g)
        mail.send(partner, TAG_REQUEST, _message(REQUEST, rank, learner.steps, 0, x, n))
        pending = mail.irecv(partner, TAG_REPLY, n + HEADER, torch.float32)
        loss = learner.gradient()
        t_wait = recorder.now()
        reply = pending.wait()
        waited = recorder.now() - t_wait
        _, _, their_steps, end = _header(reply)
        learner.load((x + reply[HEADER:]) / 2)   # both now hold (x_i + x_j) / 2
        learner.apply()
        exchanges += 1
        max_gap = max(max_gap, abs(learner.steps - their_steps))
        stop = bool(end) or learner.steps >= learner.total
        recorder.step(learner, loss, t0, waited, mail.counters())
    for j in roles.partners[rank]:
        mail.send(j, TAG_REQUEST, _message(END, rank, learner.steps, 1, None, n))
    mail.flush()
    recorder.report.gaps = {"partners": max_gap}
    recorder.report.stats = {"role": "active", "exchanges": exchanges,
                             "partners": list(roles.partners[rank])}
    return learner.steps


def _passive(cfg: TrainConfig, env: WorkerEnv, learner: Learner, recorder: Recorder,
             roles: Roles) -> int:
    rank, n = env.rank, learner.numel
    mail = Mailbox(rank, cfg.timeout_s, "adpsgd")
    book = PassiveBook(rank, roles.partners[rank])
    shadow = copy.deepcopy(learner.model)
    shadow_params = [p for p in shadow.parameters() if p.requires_grad]

    def serve(src: int, buf: torch.Tensor) -> bool:   # runs with mail.cond held
        kind, sender, their_steps, _ = _header(buf)
        if kind == END:
            book.on_end(sender)
            return book.all_ended
        mine = learner.vector()
        end = book.on_request(sender, their_steps, learner.steps)
        learner.load((mine + buf[HEADER:]) / 2)
        mail.send(sender, TAG_REPLY, _message(REPLY, rank, learner.steps, int(end), mine, n))
        return False

    mail.listen(None, TAG_REQUEST, n + HEADER, torch.float32, serve)
    while True:
        t0 = recorder.now()
        with mail.cond:
            mail.check()
            with torch.no_grad():
                torch.nn.utils.vector_to_parameters(learner.vector(), shadow_params)
        loss = learner.gradient(shadow)
        t_wait = recorder.now()
        with mail.cond:   # apply g (computed at the older model) to the current model
            waited = recorder.now() - t_wait
            for p, q in zip(learner.params, shadow_params, strict=True):
                p.grad = q.grad
            learner.apply()
            stop = learner.steps >= learner.total or book.stop_requested
            if stop:
                book.ending = True
            recorder.step(learner, loss, t0, waited, mail.counters())
        if stop:
            break
    mail.join("every active neighbour to end")
    recorder.report.gaps = {"partners": book.max_step_gap}
    recorder.report.stats = {"role": "passive", "exchanges": book.requests,
                             "partners": list(roles.partners[rank])}
    return learner.steps
