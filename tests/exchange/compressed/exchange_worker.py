"""One rank of the compressed-exchange checks (started by test_exchange.py with env://).

Every rank draws the same per-rank inputs, runs the compressed exchange over the named inner
exchange for a few calls, and compares each result with the in-process simulation of all
ranks (simulate.py) with fresh compressors bound to each rank.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from dlcomm.compress import make_compressor  # noqa: E402
from dlcomm.exchange import ExchangeContext, make_exchange  # noqa: E402
from dlcomm.exchange.compressed import compressed_exchange  # noqa: E402
from tests.compress.simulate import simulate  # noqa: E402


def inputs(call: int, world: int, numel: int) -> list[torch.Tensor]:
    return [torch.randn(numel, generator=torch.Generator().manual_seed(1000 * call + r))
            for r in range(world)]


def main(inner_spec: str, specs: list[str], numel: int, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report = {}
    for spec in specs:
        ctx = ExchangeContext(rank, world)
        exchange = compressed_exchange(make_exchange(inner_spec, ctx), spec, "none", ctx)
        reference = [make_compressor(spec) for _ in range(world)]
        for r, c in enumerate(reference):
            c.bind(r, world)
        errors = []
        for call in range(4):
            if call == 2:  # the exchange forgets per-tensor state when iteration 2 begins
                for c in reference:
                    c.reset()
            xs = inputs(call, world, numel)
            got = exchange.allreduce(xs[rank].clone(), key=0).wait()
            if call < reference[0].warmup_iterations:  # uncompressed warm-up
                expected = torch.stack(xs).sum(0)
            else:
                expected = simulate(reference, xs, name=f"0:{numel}")
            if isinstance(expected, list):
                expected = expected[rank].total
            errors.append(float((got - expected).abs().max()))
        stats = exchange.stats().as_dict()
        exchange.close()
        report[spec] = {"errors": errors, "bytes_sent": stats["bytes_sent"],
                        "counting": stats["counting"], "traffic_ratio": stats["traffic_ratio"],
                        "direct_calls": stats["direct_calls"]}
    if rank == 0:
        Path(out).write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(";"), int(sys.argv[3]), sys.argv[4])
