"""Children die with their parent, even one that died first; stale job directories go."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from dlcomm.runtime.jobdir import collect_stale, job_directory, owner_alive
from dlcomm.runtime.processes import PARENT_VAR, ChildTimeout, describe_exit, run_child, spawn, stop

CHILD = ("import sys, time; from dlcomm.runtime.processes import die_with_parent; "
         "die_with_parent(); print('up', flush=True); time.sleep(60)")


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    """The race PR_SET_PDEATHSIG alone leaves open: the parent died before the child asked.
    The child checks its parent against the one it was started by, after asking."""
    env = {**os.environ, PARENT_VAR: "1"}  # not our pid: as if our parent had died already
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 128 + 9 and "up" not in res.stdout
    assert time.monotonic() - start < 20


def test_a_child_dies_when_its_parent_is_killed(tmp_path):
    middle = ("import sys, time; from dlcomm.runtime.processes import spawn; "
              f"p = spawn([sys.executable, '-c', {CHILD!r}]); print(p.pid, flush=True); "
              "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", middle], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    parent.kill()
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child outlived its killed parent"
        time.sleep(0.05)
    parent.stdout.close()


def test_the_environment_variable_is_not_passed_on():
    code = ("import os; from dlcomm.runtime.processes import die_with_parent; "
            f"die_with_parent(); print(os.environ.get({PARENT_VAR!r}))")
    proc = spawn([sys.executable, "-c", code], capture=True)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "None"


def test_stop_ends_a_child_that_ignores_sigterm():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    proc = spawn([sys.executable, "-c", code])
    time.sleep(0.5)
    stop([proc], grace_s=0.5)
    assert proc.returncode == -9 and describe_exit(proc.returncode) == "killed by signal SIGKILL"


def test_run_child_times_out_and_leaves_nothing():
    start = time.monotonic()
    with pytest.raises(ChildTimeout, match="did not finish within 1 s"):
        run_child([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
    assert time.monotonic() - start < 10
    assert run_child([sys.executable, "-c", "print(42)"], 30).stdout.strip() == "42"


def test_run_child_hands_over_each_stderr_line_as_it_comes():
    """Progress: each line reaches the callback while the child still runs; the whole of
    both streams comes back as without the callback; a timeout still stops the child."""
    code = ("import sys, time\n"
            "for i in range(3):\n"
            "    print(f'step {i}', file=sys.stderr, flush=True); time.sleep(0.3)\n"
            "print('out')")
    seen: list[tuple[str, float]] = []
    start = time.monotonic()
    res = run_child([sys.executable, "-c", code], 30,
                    on_line=lambda line: seen.append((line, time.monotonic())))
    end = time.monotonic()
    assert [line for line, _ in seen] == ["step 0", "step 1", "step 2"]
    assert seen[0][1] < end - 0.4  # before the child was done
    assert res.stdout == "out\n" and res.stderr == "step 0\nstep 1\nstep 2\n"
    assert end - start < 20
    with pytest.raises(ChildTimeout):
        run_child([sys.executable, "-c", "import time; time.sleep(60)"], 1,
                  on_line=lambda line: None)
    assert time.monotonic() - end < 15


def test_stale_job_directories_are_collected(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f"dlcomm-job-{dead}-1000-abcd1234"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    me = os.getpid()
    start = int(psutil.Process(me).create_time())
    mine = tmp_path / f"dlcomm-switch-{me}-{start}-efgh5678"
    mine.mkdir()
    reused = tmp_path / f"dlcomm-job-{me}-{start - 1000}-ijkl9012"  # our pid, another start
    reused.mkdir()
    other = tmp_path / "dlcomm-unrelated"
    other.mkdir()
    assert owner_alive(me, start) and not owner_alive(me, start - 1000)
    removed = collect_stale(tmp_path)
    assert sorted(removed) == sorted([stale, reused])
    assert mine.exists() and other.exists()
    with job_directory("job") as path:
        assert path.parent == tmp_path and path.name.startswith(f"dlcomm-job-{me}-{start}-")
    assert not path.exists()
