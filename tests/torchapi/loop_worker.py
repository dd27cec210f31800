"""One rank that all-reduces a 64 KB tensor through the dlcomm backend, step after step.

    loop_worker.py STEPS [DIE_RANK DIE_STEP]

Rank DIE_RANK leaves at step DIE_STEP without a word (os._exit), as a crashed rank would;
the others must fail with torch's error and dlcomm's reason in it, and print it as
"failed: TYPE: MESSAGE" before exiting with code 3. STEPS 0 means forever (until a signal).
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main(steps: int, die_rank: int = -1, die_step: int = -1) -> int:
    dist.init_process_group("dlcomm", timeout=datetime.timedelta(seconds=20))
    rank = dist.get_rank()
    print("ready", flush=True)
    x = torch.ones(16384)
    step = 0
    start = time.monotonic()
    try:
        while steps == 0 or step < steps:
            if rank == die_rank and step == die_step:
                os._exit(1)
            dist.all_reduce(x)
            x.fill_(1.0)
            step += 1
    except Exception as exc:
        first = str(exc).strip().splitlines()[0]
        print(f"failed after {time.monotonic() - start:.1f} s: {type(exc).__name__}: {first}",
              flush=True)
        return 3
    dist.destroy_process_group()
    return 0


# leave as dlcomm's workers do: torch's gloo threads occasionally abort the process
# during interpreter finalization (docs/ARCHITECTURE.md)
if __name__ == "__main__":
    code = main(*map(int, sys.argv[1:]))
    sys.stdout.flush()
    os._exit(code)
