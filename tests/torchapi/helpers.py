"""Starting torch programs the way users do: torchrun, or env:// ranks by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import Rendezvous

HERE = Path(__file__).parent
TUTORIAL = HERE / "ddp_tutorial.py"
GRADIENT_BYTES = 4 * (10 * 256 + 256 + 256 * 5 + 5)  # the tutorial's model, per step


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This environment without dlcomm's own variables, TMPDIR in ``tmp`` (traceable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCOMM_")}
    return {**env, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", **extra}


GLOO_EXIT_ABORT = "exitcode  : -6"  # torchrun's summary of a rank killed by SIGABRT


def torchrun(tmp: Path, nproc: int, script: Path, *args: str, env: dict[str, str] | None = None,
             timeout: float = 180) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node N script args``.

    Run again, up to twice, if a rank was aborted: torch's gloo threads occasionally abort
    a process during interpreter finalization ("terminate called without an active
    exception", with either backend; docs/ARCHITECTURE.md); two in a row failed plain
    gloo's reference run once on a busy 2-core machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), str(script), *args]
    for _ in range(3):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp,
                             env=env or clean_env(tmp))
        if res.returncode == 0 or GLOO_EXIT_ABORT not in res.stderr:
            break
    return res


def run_ranks(world: int, script: Path, *args: str, env: dict[str, str],
              timeout: float = 180) -> list[subprocess.CompletedProcess]:
    """``world`` env:// ranks of ``script`` (the store hosted here, as dlcomm's launcher does)."""
    rdzv = Rendezvous()
    procs = [subprocess.Popen([sys.executable, str(script), *args],
                              env={**env, "RANK": str(r), "WORLD_SIZE": str(world), **rdzv.env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def last_json(text: str) -> dict:
    return json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1])
