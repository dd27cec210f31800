"""PyTorch's DDP tutorial ("Getting Started with Distributed Data Parallel", demo_basic),
on CPU, for 20 steps: started by torchrun, identical for every backend but its name.

    torchrun --nproc-per-node 4 ddp_tutorial.py BACKEND OUT.pt

The toy model is wider than the tutorial's (10 -> 256 -> 5) so that its one gradient
bucket (16 KB) is a large all-reduce; rank 0 saves the final weights to OUT.pt.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 256)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(256, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(backend: str, out: str, steps: int = 20) -> None:
    dist.init_process_group(backend)
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")
    torch.manual_seed(0)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    for _ in range(steps):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, generator=gen))
        labels = torch.randn(20, 5, generator=gen)
        loss_fn(outputs, labels).backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()
    print(f"Finished running basic DDP example on rank {rank}.")


if __name__ == "__main__":
    demo_basic(sys.argv[1], sys.argv[2])
