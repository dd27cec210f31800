"""A sans-I/O reference: run a compressor on n simulated workers in one process.

Every worker's rounds are driven in lockstep and each Round is answered with the exact sum
(or maximum) over the workers, so what a real exchange returns can be compared with it.
"""

from __future__ import annotations

import torch

from dlcomm.compress.base import Compressor, Outcome


def simulate(compressors: list[Compressor], tensors: list[torch.Tensor], name: str = "t",
             shapes: list[torch.Size] | None = None) -> list[Outcome] | torch.Tensor:
    """Summable: each worker's Outcome. Otherwise: the aggregated sum (or majority x n).

    The caller binds compressor i to rank i (``bind``) once, as an exchange does."""
    world = len(compressors)
    if compressors[0].summable:
        gens = [c.rounds(t.clone(), name, world, shapes) for c, t in zip(compressors, tensors)]
        requests = [next(g) for g in gens]
        while True:
            answers = []
            for i in range(len(requests[0].tensors)):
                parts = [r.tensors[i] for r in requests]
                if requests[0].op == "max":
                    answers.append(torch.stack(parts).amax(dim=0))
                elif parts[0].dtype.is_floating_point:
                    total = torch.stack([p.double() for p in parts]).sum(0)
                    answers.append(total.to(parts[0].dtype))
                else:
                    answers.append(torch.stack([p.to(torch.int64) for p in parts]).sum(0))
            outcomes, nexts = [], []
            for g in gens:
                try:
                    nexts.append(g.send([a.clone() for a in answers]))
                except StopIteration as stop:
                    outcomes.append(stop.value)
            if outcomes:
                return outcomes
            requests = nexts
    total = torch.zeros(tensors[0].numel())
    for c, t in zip(compressors, tensors):
        payload, ctx = c.compress(t.clone(), name)
        c.decompress_add(payload, ctx, total)
    if compressors[0].aggregation == "majority":
        total = torch.sign(total) * world
    return total
