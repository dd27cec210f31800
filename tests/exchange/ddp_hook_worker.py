"""One rank of the hook-vs-torch check (started by test_hook.py with env:// variables).

Two DDP copies of the same model see the same batch: one with torch's built-in all-reduce,
one with dlcomm's exchange hook over the named exchange. Their gradients must agree.
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlcomm.exchange import ExchangeContext, ExchangeHookState, exchange_hook, make_exchange
from dlcomm.volume import ring_allreduce_bytes
from dlcomm.workloads.digits import DigitsCNN


def main(exchange_spec: str, rtol: float = 1e-6, atol: float = 1e-7) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    reference = DistributedDataParallel(DigitsCNN())
    torch.manual_seed(0)
    ours = DistributedDataParallel(DigitsCNN())
    exchange = make_exchange(exchange_spec, ExchangeContext(rank, world))
    ours.register_comm_hook(ExchangeHookState(exchange, world), exchange_hook)
    grad_bytes = sum(p.numel() * 4 for p in ours.parameters())
    for step in range(3):
        gen = torch.Generator().manual_seed(100 * step + rank)  # different data per rank
        x, y = torch.randn(8, 1, 8, 8, generator=gen), torch.randint(0, 10, (8,), generator=gen)
        for model in (reference, ours):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
        for p_ref, p_ours in zip(reference.parameters(), ours.parameters()):
            torch.testing.assert_close(p_ours.grad, p_ref.grad, rtol=rtol, atol=atol)
    stats = exchange.stats()
    assert stats.elements == 3 * grad_bytes // 4, stats
    assert stats.bytes_sent == 3 * ring_allreduce_bytes(grad_bytes, world) or \
        stats.counting == "measured", stats
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], *map(float, sys.argv[2:]))
