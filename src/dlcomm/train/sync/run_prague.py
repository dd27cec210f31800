"""Prague on torch.distributed processes: local steps, the Group Generator, P-Reduce.

Set-up: rank 0 starts the Group Generator service (:mod:`.service`) and broadcasts its
address and a random job token through torch.distributed; every worker connects with the
token. Each iteration: compute a gradient and apply it locally, ask the GG for a group,
P-Reduce with it (:mod:`.preduce`). A worker that has taken all its steps keeps asking
(and running the groups others wait in) until the GG says stop.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.common import Learner
from dlcomm.train.config import TrainConfig
from dlcomm.train.sync.prague import PragueSpec, StaticSchedule, make_generator
from dlcomm.train.sync.preduce import GlooGroups, PartialAllReduce, SwitchGroups
from dlcomm.train.sync.recorder import Recorder, wait_until_all_finished
from dlcomm.train.sync.service import GroupClient, GroupService, new_token, reachable_address

__all__ = ["run_prague"]


def run_prague(cfg: TrainConfig, env: WorkerEnv, learner: Learner, recorder: Recorder,
               spec: PragueSpec) -> int:
    """Train this worker with Prague until the GG ends the run; returns its P-Reduces."""
    rank = env.rank
    generator = make_generator(spec.generator, env.world_size, spec.group_size, cfg.seed,
                               window_s=None if spec.window_ms is None else spec.window_ms / 1e3)
    service = None
    box: list[tuple[tuple[str, int], str] | None] = [None]
    if rank == 0:
        service = GroupService(generator, reachable_address(env.master_addr, env.master_port),
                               new_token())
        box = [(service.address, service.token)]
    dist.broadcast_object_list(box, src=0)  # the job's own rendezvous carries the token
    assert box[0] is not None  # rank 0's service address and job token, on every rank
    address, token = box[0]
    client = GroupClient((str(address[0]), int(address[1])), rank, cfg.timeout_s, token)
    preduce: PartialAllReduce
    if spec.impl == "switch":
        assert isinstance(generator, StaticSchedule)
        preduce = SwitchGroups(env, cfg.exchange, generator.distinct_groups(),
                               f"prague{os.getppid()}")
    else:
        preduce = GlooGroups(env, cfg.timeout_s)
    joined = 0
    try:
        recorder.start_together(learner)
        stop = False
        while not stop:
            t0 = recorder.now()
            loss = learner.gradient()
            learner.apply()
            t_wait = recorder.now()
            while True:
                group = client.ask(learner.steps, final=learner.steps >= learner.total)
                if group is None:
                    stop = True
                    break
                learner.load(preduce.average(group.members, learner.vector()))
                joined += 1
                if learner.steps < learner.total:
                    break
            recorder.step(learner, loss, t0, recorder.now() - t_wait, preduce.counters())
        wait_until_all_finished(env, cfg.timeout_s, "prague")  # all stopped: the GG may go
    finally:
        client.close()
        preduce.close()
        if service is not None:
            service.close()
    if service is not None:
        if service.error:
            raise RuntimeError(service.error)
        recorder.report.gaps = {"groups": generator.max_step_gap}
        recorder.report.stats = {**generator.stats(), "impl": spec.impl,
                                 "group_size": spec.group_size}
    else:
        recorder.report.stats = {"generator": spec.generator, "impl": spec.impl,
                                 "group_size": spec.group_size}
    recorder.report.stats["p_reduces"] = joined
    recorder.report.exchange = {"counting": preduce.counting}
    return joined
