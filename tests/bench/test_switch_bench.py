"""``dlcomm bench switch``: the load generator drives a real switch process; every row has
its rates, the Python and native dataplanes and two threads side by side; bad options fail
in one line."""

from __future__ import annotations

import json

from dlcomm.bench.switch_rate import measure_switch
from tests.conftest import run_dlcomm
from tests.native.twins import needs_native

pytestmark = needs_native


def test_rows_for_every_variant_workers_and_payload():
    result = measure_switch([("native", 1), ("native", 2), ("python", 1)], [2, 4], ["1KB"],
                            0.3, "authenticated", True)
    rows = result["rows"]
    assert {(r["dataplane"], r["threads"], r["workers"]) for r in rows} == \
        {(d, t, n) for d, t in [("native", 1), ("native", 2), ("python", 1)] for n in (2, 4)}
    for r in rows:
        assert r["rounds"] > 0 and r["results"] == r["rounds"] * r["workers"] or \
            r["results"] >= r["rounds"] * r["workers"]
        assert r["input_gbps"] > 0 and r["input_gbps_per_core"] > 0
        assert r["send_errors"] == 0
    assert set(result["summary"]) == {"1KB"}


def test_the_command_writes_json_and_a_plot_and_refuses_bad_payloads(tmp_path):
    out, plot = tmp_path / "s.json", tmp_path / "s.png"
    res = run_dlcomm("bench", "switch", "--workers", "2", "--payloads", "8KB", "--threads",
                     "1", "--dataplanes", "native", "--seconds", "0.3", "--json", str(out),
                     "--plot", str(plot), tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["kind"] == "bench-switch"
    assert plot.stat().st_size > 1000
    res = run_dlcomm("bench", "switch", "--payloads", "3KB", tmp=tmp_path)
    assert res.returncode != 0
    assert res.stderr.strip() == "dlcomm: error: --payloads takes 1KB, 8KB, 64KB, got '3KB'"


def test_sigterm_stops_the_switch_and_leaves_no_files(tmp_path):
    """A SIGTERM while a row runs unwinds like Ctrl-C: the switch process stops and its
    job directory (logs, counters) goes."""
    import os
    import signal
    import subprocess
    import time

    import psutil

    from tests.conftest import dlcomm_cmd

    work = tmp_path / "tmp"
    work.mkdir()
    proc = subprocess.Popen(dlcomm_cmd("bench", "switch", "--workers", "2", "--payloads", "1KB",
                                       "--threads", "1", "--dataplanes", "native,python",
                                       "--seconds", "2", "--json", str(tmp_path / "s.json")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(work)})
    deadline = time.monotonic() + 60
    while not any(work.iterdir()) and time.monotonic() < deadline:   # the switch is up
        time.sleep(0.05)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1].strip()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.splitlines()[-1] == "dlcomm: error: interrupted by SIGTERM; all workers stopped"
    assert not any(work.iterdir()) and not (tmp_path / "s.json").exists()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
