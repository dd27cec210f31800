"""One rank of the hooks check (env://, started by test_hooks.py).

    hooks_worker.py torch-hooks          DDP over backend "dlcomm" with torch's own
                                         fp16_compress_hook and powerSGD_hook, against
                                         the same hooks over a gloo group
    hooks_worker.py dlcomm-hook SPEC [COMPRESS]
                                         DDP over gloo with dlcomm.torch.hook(SPEC,
                                         compress=COMPRESS), against plain DDP over gloo

Gradients must agree within the method's bound; prints "ok" and the exchange's stats.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

import dlcomm.torch


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def grads_after(model, steps=3):
    rank = dist.get_rank()
    out = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * step + rank)
        model.zero_grad()
        x, y = torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def assert_same(ours, ref, rtol, atol):
    for step_ours, step_ref in zip(ours, ref):
        for a, b in zip(step_ours, step_ref):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def torch_hooks() -> None:
    dist.init_process_group("dlcomm")
    ref_group = dist.new_group(backend="gloo")
    for name, make in [
        ("fp16", lambda: (None, default_hooks.fp16_compress_hook)),
        ("powersgd", lambda: (powersgd.PowerSGDState(process_group=None,
                                                     matrix_approximation_rank=2,
                                                     start_powerSGD_iter=2),
                              powersgd.powerSGD_hook)),
    ]:
        ours = DDP(net())
        ours.register_comm_hook(*make())
        ref = DDP(net(), process_group=ref_group)
        state, hook = make()
        if state is not None:
            state.process_group = ref_group
        ref.register_comm_hook(state, hook)
        # through the switch the fp16 sums round once more; PowerSGD's small factors
        # and the full-rank warm-up steps are large enough for the exchange too
        assert_same(grads_after(ours), grads_after(ref), rtol=5e-3, atol=5e-4)
        print(f"{name} ok", flush=True)
    print(json.dumps(dlcomm.torch.stats()))
    dist.destroy_process_group()


def dlcomm_hook(spec: str, compress: str | None = None) -> None:
    dist.init_process_group("gloo")
    ref = DDP(net())
    ours = DDP(net())
    state, hook = dlcomm.torch.hook(spec, compress=compress)
    ours.register_comm_hook(state, hook)
    tol = (1e-2, 1e-3) if compress else (1e-5, 1e-6)
    assert_same(grads_after(ours), grads_after(ref), *tol)
    print("ok", flush=True)
    print(json.dumps(state.exchange.stats().as_dict()))
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "torch-hooks":
        torch_hooks()
    else:
        dlcomm_hook(*sys.argv[2:])
    sys.stdout.flush()
    os._exit(0)
