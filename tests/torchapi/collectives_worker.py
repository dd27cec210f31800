"""One rank of the collectives check: every torch.distributed collective on the dlcomm
default group against the same call on a gloo group, on the same random inputs.

Started with env:// variables by test_collectives.py; prints "ok N" (N = calls compared)
and a JSON line of the backend's routes. A gloo error must be the dlcomm error too.
"""

import faulthandler
import json
import os
import signal
import sys

import torch
import torch.distributed as dist

import dlcomm.torch

OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
       "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]
# through the switch: 32-bit fixed point after the agreed exponent (~1e-8 of the largest
# value per chunk); float16/bfloat16 are summed in float32 there and in their own
# precision by gloo, so the two differ by the dtype's rounding
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-2, 2e-2),
       torch.bfloat16: (6e-2, 6e-2), torch.float64: (1e-12, 1e-12), torch.int64: (0, 0)}


class Checker:
    def __init__(self, ref):
        self.ref = ref
        self.calls = 0

    def same(self, fn, *inputs, dtype=torch.float32, name=""):
        """fn(group, *copies) on both groups: equal outputs, or the same error."""
        ours_in = [x.clone() for x in inputs]
        ref_in = [x.clone() for x in inputs]
        ours = ref = None
        try:
            ref = fn(self.ref, *ref_in)
        except Exception as exc:  # gloo refuses: ours must refuse alike
            try:
                fn(None, *ours_in)
            except Exception as mine:
                assert type(mine) is type(exc), (name, mine, exc)
                self.calls += 1
                return
            raise AssertionError(f"{name}: gloo raised {exc!r}, dlcomm did not") from None
        ours = fn(None, *ours_in)
        rtol, atol = TOL[dtype]
        for a, b in zip(_flat(ours), _flat(ref)):
            if isinstance(a, torch.Tensor):
                floats = b.is_floating_point() and b.numel()
                scale = max(1.0, float(b.abs().max())) if floats else 1.0
                torch.testing.assert_close(a, b, rtol=rtol, atol=atol * scale, msg=name)
            else:
                assert a == b, (name, a, b)
        self.calls += 1


def _flat(value):
    if isinstance(value, (list, tuple)):
        return [y for x in value for y in _flat(x)]
    return [value]


def rand(shape, dtype, gen):
    if dtype == torch.int64:
        return torch.randint(-50, 50, shape, generator=gen)
    return torch.randn(shape, generator=gen).to(dtype)


def all_reduce(op, async_op):
    def run(group, t):
        work = dist.all_reduce(t, op=op, group=group, async_op=async_op)
        if async_op:
            work.get_future().wait() if op == dist.ReduceOp.SUM else work.wait()
        return t
    return run


def check_all_reduce(check, rank, gen):
    for dtype in DTYPES:
        for numel in (7, 6000):  # gloo's side of the threshold, the exchange's
            for name, op in OPS.items():
                for async_op in (False, True):
                    x = rand((numel,), dtype, gen)
                    label = f"all_reduce {dtype} {numel} {name} async={async_op}"
                    fn = all_reduce(op, async_op)
                    check.same(fn, x, dtype=dtype, name=label)
    # a non-contiguous tensor and a 2-D one, through the exchange
    x = rand((200, 60), torch.float32, gen)
    check.same(all_reduce(dist.ReduceOp.SUM, False), x.t(), name="all_reduce transposed")
    check.same(all_reduce(dist.ReduceOp.SUM, False), x, name="all_reduce 2-D")


def check_others(check, rank, world, gen):
    x = rand((6000,), torch.float32, gen)
    check.same(lambda g, t: (dist.broadcast(t, src=1, group=g), t)[1], x, name="broadcast")

    def all_gather(g, t):
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t, group=g)
        return out
    check.same(all_gather, x, name="all_gather")

    def all_gather_into(g, t):
        out = torch.empty(world * t.numel())
        dist.all_gather_into_tensor(out, t, group=g)
        return out
    check.same(all_gather_into, x, name="all_gather_into_tensor")

    def gather(g, t):
        out = [torch.empty_like(t) for _ in range(world)] if rank == 0 else None
        dist.gather(t, out, dst=0, group=g)
        return out or []
    check.same(gather, x, name="gather")

    def scatter(g, t):
        out = torch.empty(1000)
        dist.scatter(out, list(t.view(world, -1)[:, :1000]) if rank == 0 else None, src=0,
                     group=g)
        return out
    check.same(scatter, rand((world, 1500), torch.float32, gen), name="scatter")

    def reduce(g, t):
        dist.reduce(t, dst=0, group=g)
        return t if rank == 0 else []
    check.same(reduce, x, name="reduce")

    def reduce_scatter(g, t):
        out = torch.empty(t.numel() // world)
        dist.reduce_scatter_tensor(out, t, group=g)
        return out
    check.same(reduce_scatter, rand((world * 1000,), torch.float32, gen), name="reduce_scatter")

    def reduce_scatter_list(g, t):
        out = torch.empty(t.numel() // world)
        dist.reduce_scatter(out, list(t.chunk(world)), group=g)
        return out
    check.same(reduce_scatter_list, rand((world * 1000,), torch.float32, gen),
               name="reduce_scatter list")

    def all_to_all_single(g, t):
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t, group=g)
        return out
    check.same(all_to_all_single, rand((world * 100,), torch.float32, gen),
               name="all_to_all_single")

    def all_to_all(g, t):
        out = [torch.empty(100) for _ in range(world)]
        dist.all_to_all(out, list(t.chunk(world)), group=g)
        return out
    check.same(all_to_all, rand((world * 100,), torch.float32, gen), name="all_to_all")

    check.same(lambda g: dist.barrier(group=g), name="barrier")

    def send_recv(g, t):
        peer = rank ^ 1
        if peer >= world:
            return t
        if rank % 2 == 0:
            dist.send(t, dst=peer, group=g)
            dist.recv(t, src=peer, group=g)
        else:
            got = torch.empty_like(t)
            dist.recv(got, src=peer, group=g)
            dist.send(t, dst=peer, group=g)
            t = got
        return t
    check.same(send_recv, x, name="send/recv")

    def isend_irecv(g, t):
        right, left = (rank + 1) % world, (rank - 1) % world
        got = torch.empty_like(t)
        ops = [dist.P2POp(dist.isend, t, right, group=g),
               dist.P2POp(dist.irecv, got, left, group=g)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return got
    check.same(isend_irecv, x, name="batch_isend_irecv")

    def objects(g):
        out = [None] * world
        dist.all_gather_object(out, {"rank": rank, "x": [rank] * 3}, group=g)
        box = [f"from {rank}"]
        dist.broadcast_object_list(box, src=0, group=g)
        return [str(out), box[0]]
    check.same(objects, name="objects")


def check_subgroup(check, rank, world, gen):
    """new_group with the default backend (dlcomm: its collectives are gloo's)."""
    ranks = list(range(0, world, 2))
    ours = dist.new_group(ranks)
    ref = dist.new_group(ranks, backend="gloo")
    if rank not in ranks:
        return
    assert dist.get_backend(ours) == "dlcomm", dist.get_backend(ours)
    for numel in (7, 6000):
        x = rand((numel,), torch.float32, gen)

        def sub(g, t):
            dist.all_reduce(t, group=ours if g is None else ref)
            return t
        check.same(sub, x, name=f"subgroup all_reduce {numel}")


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    dist.init_process_group("dlcomm")
    assert dist.get_backend() == "dlcomm"
    rank, world = dist.get_rank(), dist.get_world_size()
    ref = dist.new_group(backend="gloo")
    check = Checker(ref)
    gen = torch.Generator().manual_seed(rank)
    check_all_reduce(check, rank, gen)
    check_others(check, rank, world, gen)
    check_subgroup(check, rank, world, gen)
    stats = dlcomm.torch.stats()
    print(f"ok {check.calls}")
    print(json.dumps(stats))
    dist.barrier()
    dist.destroy_process_group()


# leave as dlcomm's workers do: torch's gloo threads occasionally abort the process
# during interpreter finalization (docs/ARCHITECTURE.md)
if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
