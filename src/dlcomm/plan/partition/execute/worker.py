"""One rank of an executed partition plan: ``python -m dlcomm.plan.partition.execute.worker JOB``.

Started by launch.py with the env:// variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Reads ``JOB/job.json``; for every plan in it, trains ``steps`` steps of SGD
and writes ``JOB/rank<r>.json`` (losses, times, elements sent and received per key) and
``JOB/rank<r>.pt`` (the gradient shards of every step). On an error it writes one line to
``JOB/rank<r>.err`` and exits 1.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dlcomm.plan.partition.execute.comm import Comm
from dlcomm.plan.partition.execute.model import (PartitionedNet, build_program,
                                                   executable_table, init_weights, make_batch)
from dlcomm.plan.partition.graph import build_graph
from dlcomm.workloads.catalog.base import Layer, ModelTable

__all__ = ["table_to_dict", "table_from_dict", "run_rank", "main"]


def table_to_dict(table: ModelTable) -> dict[str, Any]:
    return {"name": table.name, "family": table.family, "sample": table.sample,
            "published_params": table.published_params, "source": table.source,
            "default_batch": table.default_batch,
            "layers": [{f.name: getattr(x, f.name) for f in fields(Layer)} for x in table.layers]}


def table_from_dict(d: dict[str, Any]) -> ModelTable:
    return ModelTable(d["name"], d["family"], tuple(Layer(**x) for x in d["layers"]),
                      d["sample"], d["published_params"], d["source"], d["default_batch"])


def run_rank(job: dict[str, Any], rank: int, world: int) -> tuple[dict[str, Any], dict]:
    """Train every plan of the job on this rank; return the report and gradient shards."""
    table = executable_table(table_from_dict(job["table"]))
    program, graph = build_program(table), build_graph(table)
    dtype = getattr(torch, job.get("dtype", "float32"))
    report: dict[str, Any] = {"rank": rank, "plans": []}
    shards: dict[int, list] = {}
    for i, spec in enumerate(job["plans"]):
        comm = Comm(rank, world)
        weights = init_weights(program, job["seed"], dtype)
        net = PartitionedNet(program, graph, spec["types"], spec["splits"], job["batch"], comm,
                             weights, spec["slowdowns"][rank])
        steps, grads = [], []
        for step in range(job["steps"]):
            if job.get("fail_rank") == rank and step == job["steps"] - 1:
                raise RuntimeError("injected failure")
            x, target = make_batch(program, job["batch"], job["seed"], step, dtype)
            start, comm_before, compute_before = (time.perf_counter(), comm.seconds,
                                                  net.clock.seconds)
            loss = net.loss(net.forward(x), target)
            loss.backward()
            net.reduce_gradients()
            grads.append(net.gradients())
            net.sgd(job["lr"])
            steps.append({"loss": float(loss), "step_s": time.perf_counter() - start,
                          "comm_s": comm.seconds - comm_before,
                          "compute_s": net.clock.seconds - compute_before})
        report["plans"].append({"steps": steps, "sent": dict(comm.sent),
                                "received": dict(comm.received)})
        shards[i] = grads
    return report, shards


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job_dir = Path(args[0])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        job = json.loads((job_dir / "job.json").read_text())
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=job["timeout_s"]))
        report, shards = run_rank(job, rank, world)
        torch.save(shards, job_dir / f"rank{rank}.pt")
        (job_dir / f"rank{rank}.json").write_text(json.dumps(report))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # one line for the launcher, then a non-zero exit
        line = (f"{type(exc).__name__}: {exc}".splitlines() or ["error"])[0]
        (job_dir / f"rank{rank}.err").write_text(line)
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: gloo threads can abort it (docs/ARCHITECTURE.md)


if __name__ == "__main__":
    main()
