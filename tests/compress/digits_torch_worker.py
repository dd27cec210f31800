"""One rank of digits-cnn trained through ``dlcomm.torch.compression_hook`` (env://).

The training loop mirrors ``dlcomm train`` (same workload, seed, sampler, batch size, Adam
learning rate, sharded evaluation) but registers dlcomm's public hook, which passes each
bucket's parameter shapes, so PowerSGD compresses matrix by matrix. Rank 0 writes
{"accuracy": [...per epoch...]} to the path given.
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import dlcomm.torch
from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.common import evaluate
from dlcomm.workloads import make_workload


def main(compress: str, memory: str, seed: int, epochs: int, out: str) -> None:
    dist.init_process_group("gloo")
    env = WorkerEnv.from_environ()
    torch.set_num_threads(1)
    workload = make_workload("digits-cnn", seed=seed)
    model = DistributedDataParallel(workload.model)
    state = None
    if compress != "none":
        state, hook = dlcomm.torch.compression_hook(compress, memory=memory)
        model.register_comm_hook(state, hook)
    optimizer = torch.optim.Adam(model.parameters(), lr=workload.lr)
    sampler = DistributedSampler(workload.train_set, num_replicas=env.world_size, rank=env.rank,
                                 shuffle=True, seed=seed, drop_last=True)
    loader = DataLoader(workload.train_set, batch_size=workload.batch_size, sampler=sampler,
                        drop_last=True)
    accuracy = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            workload.loss(model(x), y).backward()
            optimizer.step()
        accuracy.append(evaluate(model.module, workload, env)["accuracy"])
    if state is not None:
        state.close()
    if env.rank == 0:
        with open(out, "w") as f:
            json.dump({"compress": compress, "memory": memory, "seed": seed,
                       "accuracy": accuracy}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
