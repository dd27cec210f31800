"""The exchange hook gives DDP the same gradients as torch's own all-reduce."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlcomm.volume import ring_allreduce_bytes
from tests.conftest import Rendezvous

HERE = Path(__file__).parent


def run_ranks(world: int, *args: str, timeout: float = 120) -> list[subprocess.CompletedProcess]:
    rdzv = Rendezvous()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               **rdzv.env, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(HERE / "ddp_hook_worker.py"), *args],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


@pytest.mark.parametrize("world", [2, 3])
def test_ring_hook_matches_torch_allreduce(world):
    for res in run_ranks(world, "ring"):
        assert res.returncode == 0, res.stderr[-2000:]


def test_switch_hook_matches_torch_allreduce_within_quantization():
    """Through the aggregation switch: the same gradients, up to the fixed-point bound
    (|error| <= n * 2^(e_max + L - 31) per chunk; ~1e-8 relative to the chunk's largest)."""
    from dlcomm.switch.service import running_switches

    with running_switches("127.0.0.1", 1) as service:
        results = run_ranks(3, service.spec("switch", k=512), "1e-5", "1e-6")
    for res in results:
        assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("nbytes,world,expected", [(100, 1, 0), (100, 2, 100), (120, 3, 160),
                                                   (400, 4, 600)])
def test_ring_bytes_model(nbytes, world, expected):
    assert ring_allreduce_bytes(nbytes, world) == expected
