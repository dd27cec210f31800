"""The compressed exchange over real exchanges equals the in-process simulation of all ranks.

Every rank runs ``exchange_worker.py``; the sums it gets through the ring (gloo all-reduce
and exact-size all-gathers) or through the aggregation switch must match ``simulate.py``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Rendezvous

HERE = Path(__file__).parent
REPO = HERE.parents[2]

EXACT = 1e-4  # float32 summation order only (inputs ~ N(0, 1), a few workers)
TOLERANCE = {"fp16": 2e-2, "bf16": 2e-1}  # 16-bit partial sums inside gloo's ring


def run_ranks(world: int, inner: str, specs: list[str], numel: int, tmp: Path,
              timeout: float = 150) -> dict:
    rdzv = Rendezvous()
    out = tmp / "report.json"
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               **rdzv.env, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "exchange_worker.py"), inner, ";".join(specs),
             str(numel), str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]
    return json.loads(out.read_text())


RING_SPECS = ["none", "fp16", "bf16", "topk:ratio=0.02", "randomk:ratio=0.05", "threshold:tau=1",
              "dgc", "qsgd", "terngrad", "u8bit", "signsgd", "signum", "efsignsgd", "onebit",
              "natural", "powersgd:rank=2,start=2", "powersgd:rank=1,start=0,warm=0"]


def test_every_method_over_the_ring_matches_the_simulation(tmp_path):
    report = run_ranks(3, "ring", RING_SPECS, 5003, tmp_path)
    for spec in RING_SPECS:
        tol = TOLERANCE.get(spec, EXACT)
        assert max(report[spec]["errors"]) <= tol, (spec, report[spec])
        assert report[spec]["counting"] == "modelled"
    assert report["none"]["traffic_ratio"] == pytest.approx(1.0, rel=1e-3)
    # uncompressed calls go straight to the ring from the caller's thread (direct.py); a
    # compressed method's (or a warming one's, whose memory is remembered) do not
    assert report["none"]["direct_calls"] == 4
    assert report["fp16"]["direct_calls"] == 0
    assert report["powersgd:rank=2,start=2"]["direct_calls"] == 0
    assert report["fp16"]["traffic_ratio"] == pytest.approx(2.0, rel=1e-3)
    # 8-bit levels on 3 workers: 10-bit lanes, 3 per int32 word -> 3x less than float32
    assert report["u8bit"]["traffic_ratio"] == pytest.approx(3.0, rel=1e-3)
    assert report["terngrad"]["traffic_ratio"] == pytest.approx(10.0, rel=1e-2)
    # top 2% as (value, index) pairs, all-gathered without padding
    assert report["topk:ratio=0.02"]["traffic_ratio"] > 5
    assert report["signsgd"]["traffic_ratio"] > 15


@pytest.mark.slow
def test_summable_methods_through_the_switch(tmp_path):
    """Integer lanes ride the switch's fixed point exactly; float factors within its bound."""
    from dlcomm.switch.service import running_switches

    specs = ["none", "u8bit", "qsgd:levels=15", "terngrad", "randomk:ratio=0.1", "fp16",
             "powersgd:rank=2,start=2", "topk:ratio=0.05"]
    with running_switches("127.0.0.1", 1) as service:
        report = run_ranks(2, service.spec("switch", k=512), specs, 3001, tmp_path)
    for spec in ("u8bit", "qsgd:levels=15", "terngrad", "topk:ratio=0.05"):
        assert max(report[spec]["errors"]) <= 1e-6, (spec, report[spec])
    for spec in ("none", "randomk:ratio=0.1", "powersgd:rank=2,start=2"):
        assert max(report[spec]["errors"]) <= 1e-4, (spec, report[spec])
    # the switch adds the halves as float32 (exactly); the reference rounds the sum to half
    assert max(report["fp16"]["errors"]) <= TOLERANCE["fp16"]
    assert report["none"]["counting"] == "measured"
    # the switch sums float32 words: 8-bit levels on 2 workers take 10 bits, 2 per word
    ratio = report["u8bit"]["traffic_ratio"] / report["none"]["traffic_ratio"]
    assert ratio == pytest.approx(2.0, rel=0.05)
    assert report["fp16"]["traffic_ratio"] == pytest.approx(report["none"]["traffic_ratio"],
                                                          rel=0.05)


@pytest.mark.slow
def test_sparse_methods_through_the_sparse_switch(tmp_path):
    """topk's decompressed tensor (zeros elsewhere) is summed by the sparse switch, which
    moves only the 256-element blocks holding data: it pays when few blocks do."""
    from dlcomm.exchange import EXCHANGES
    from dlcomm.switch.service import running_switches

    if "sparse-switch" not in EXCHANGES:
        pytest.skip("no sparse-switch exchange in this tree")
    specs = ["topk:ratio=0.0005", "threshold:tau=3.5"]
    with running_switches("127.0.0.1", 1) as service:
        report = run_ranks(2, service.spec("sparse-switch"), specs, 200_000,
                           tmp_path)
    for spec in specs:
        assert max(report[spec]["errors"]) <= 1e-5, (spec, report[spec])
        assert report[spec]["counting"] == "measured"
        assert report[spec]["traffic_ratio"] > 3, report[spec]
