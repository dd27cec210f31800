"""One rank of FSDP (FullyShardedDataParallel on CPU) on a small MLP for 15 steps:

    fsdp_worker.py BACKEND

prints the loss of every step as JSON ({"losses": [...]}) on rank 0."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def main(backend: str) -> None:
    dist.init_process_group(backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 4))
    model = FSDP(net, device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(32, 4, generator=gen)
    losses = []
    for step in range(15):
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(100 * step + rank))
        loss = nn.functional.mse_loss(model(x), x @ w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # a scalar: gloo, under either backend
        losses.append(float(total) / dist.get_world_size())
    if rank == 0:
        print(json.dumps({"losses": losses}))
    dist.destroy_process_group()


# leave as dlcomm's workers do: torch's gloo threads occasionally abort the process
# during interpreter finalization (docs/ARCHITECTURE.md)
if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
    os._exit(0)
