"""One rank of the PowerSGD-vs-torch check (started by test_powersgd_torch.py, env://).

Two DDP copies of the same model train on the same batches with plain SGD: one with
torch's ``powerSGD_hook``, one with ``dlcomm.torch.compression_hook("powersgd:...")``; the
averaged gradients of every step and the final parameters must agree. One bucket: torch's
hook issues its later collectives from Future callbacks, whose order across several buckets
differs between ranks under gloo (a collective mismatch in the reference, not in dlcomm).
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
from torch.nn.parallel import DistributedDataParallel

import dlcomm.torch
from dlcomm.workloads.digits import DigitsCNN


def main(rank_r: int, warm: int, error_feedback: int, steps: int = 6) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    reference = DistributedDataParallel(DigitsCNN(), bucket_cap_mb=25)
    torch.manual_seed(0)
    ours = DistributedDataParallel(DigitsCNN(), bucket_cap_mb=25)
    ref_state = torch_psgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=rank_r, start_powerSGD_iter=2,
        min_compression_rate=2, use_error_feedback=bool(error_feedback),
        warm_start=bool(warm), random_seed=7)
    reference.register_comm_hook(ref_state, torch_psgd.powerSGD_hook)
    memory = "powersgd" if error_feedback else "none"
    state, hook = dlcomm.torch.compression_hook(
        f"powersgd:rank={rank_r},start=2,min_rate=2,warm={warm},seed=7", memory=memory)
    ours.register_comm_hook(state, hook)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (reference, ours)]
    worst = 0.0
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * step + rank)  # different data per rank
        x, y = torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        for model, opt in zip((reference, ours), optimizers):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
        for p_ref, p_ours in zip(reference.parameters(), ours.parameters()):
            worst = max(worst, float((p_ours.grad - p_ref.grad).abs().max()))
            torch.testing.assert_close(p_ours.grad, p_ref.grad, rtol=1e-4, atol=1e-6)
        for opt in optimizers:
            opt.step()
    for p_ref, p_ours in zip(reference.parameters(), ours.parameters()):
        torch.testing.assert_close(p_ours, p_ref, rtol=1e-4, atol=1e-6)
    stats = state.exchange.stats().as_dict()
    assert stats["calls"] >= steps, stats
    assert stats["methods"][0]["compression_rate"] > 2, stats
    state.close()
    print(f"rank {rank}: max |grad difference| {worst:.3g}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
