"""One rank of a switch-exchange scenario (started by test_switch_sockets.py).

argv: SWITCH_SPEC MODE NUMEL [SEED]; prints one JSON line: {"rank", "checksum"|"error", ...}.
Modes: sum, die (rank 2 exits right after bootstrap), hang (rank 2 never sends), nan
(rank 1 has a NaN), mismatch (rank 1 has a longer tensor), many (all-reduces for 12 s:
longer than a test waits before it kills the switch, however fast the data path), halves
(auto: the tensor, then it with every other block of 256 zero: a dense round's density).
"""

import hashlib
import json
import os
import sys
import time

import torch.distributed as dist

from dlcomm.bench.allreduce import make_input
from dlcomm.errors import DlcommError
from dlcomm.exchange import ExchangeContext, make_exchange


def main(spec: str, mode: str, numel: int, seed: int = 0) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank}
    ex = None
    try:
        ex = make_exchange(spec, ExchangeContext(rank, world, job_name=f"test-{mode}"))
        x = make_input(seed, rank, numel + (7 if mode == "mismatch" and rank == 1 else 0))
        if mode == "nan" and rank == 1:
            x[numel // 2] = float("nan")
        if mode == "die" and rank == 2:
            os._exit(0)  # no goodbye: the switch sees the control connection drop
        if mode == "hang" and rank == 2:
            time.sleep(7)   # past the test's 3 s deadline, then gone
            os._exit(0)
        start = time.perf_counter()
        if mode == "halves":
            ex.allreduce(x.clone()).wait()  # sparse (auto's first), then dense: all present
            x.view(-1, 256)[::2] = 0.0
        reps = 0
        while reps < 1 or (mode == "many" and time.perf_counter() - start < 12):
            result = ex.allreduce(x.clone()).wait()
            reps += 1
        out["time_s"] = time.perf_counter() - start
        out["checksum"] = hashlib.sha256(result.numpy().tobytes()).hexdigest()
        if rank == 0:
            ref = sum(make_input(seed, r, numel).double() for r in range(world))
            out["max_abs_error"] = float((result.double() - ref).abs().max())
        out["stats"] = ex.stats().as_dict()
        ex.close()  # leave the job properly: peers may still be recovering their last rounds
    except (DlcommError, RuntimeError) as exc:
        out["error"] = str(exc)
        out["error_after_s"] = time.perf_counter() - start if "start" in locals() else 0.0
    print(json.dumps(out), flush=True)
    os._exit(0)  # skip teardown barriers that a failed peer would never reach


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0)
