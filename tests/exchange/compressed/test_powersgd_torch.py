"""dlcomm's ``powersgd`` gives the same training as torch's own PowerSGD hook."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Rendezvous

HERE = Path(__file__).parent


def run_pair(*args: str, timeout: float = 150) -> None:
    rdzv = Rendezvous()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", **rdzv.env,
               "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(HERE / "powersgd_worker.py"), *args],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, (out + err)[-3000:]


def test_powersgd_matches_torch_rank4_warm_start_error_feedback():
    """Same rank, seed, start iteration, warm start and error feedback: the same gradients
    at every step (up to float rounding) and the same parameters after SGD steps."""
    run_pair("4", "1", "1")


@pytest.mark.slow
@pytest.mark.parametrize("rank,warm,feedback", [("1", "0", "1"), ("2", "1", "0")])
def test_powersgd_matches_torch_other_settings(rank, warm, feedback):
    run_pair(rank, warm, feedback)
