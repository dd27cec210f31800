"""The native switch's threads under ThreadSanitizer (csrc/harness/threads_main.c): two
serving threads on one port, load generators playing four jobs' workers (MAC, encrypted,
sparse, one of the Python dataplane whose datagrams a reader thread takes from the slow
path), and the control plane's calls meanwhile (counters, job info, failures, a job added
and removed over and over, a job removed while its workers send). Any data race ends the
run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from dlcomm.native.harness import build_threads, threads_env
from tests.native.test_sanitized import needs_gcc

pytestmark = needs_gcc


def test_the_switch_threads_share_nothing_unsynchronised(tmp_path: Path):
    binary = build_threads(tmp_path)
    res = subprocess.run([str(binary), "1.0"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **threads_env()})
    if "FATAL: ThreadSanitizer" in res.stderr:   # not a race: the runtime cannot start here
        pytest.skip(f"ThreadSanitizer cannot run here: {res.stderr.strip().splitlines()[0]}")
    assert "WARNING: ThreadSanitizer" not in res.stderr, res.stderr[-6000:]
    assert res.returncode == 0, res.stderr[-3000:]
    rounds = {int(j): int(n) for j, n in re.findall(r"job (\d+): (\d+) rounds", res.stdout)}
    assert min(rounds[1], rounds[3], rounds[9]) > 100, res.stdout   # the aggregating jobs ran
    slow = re.search(r"(\d+) packets in, (\d+) to the slow path", res.stdout)
    assert slow and int(slow.group(1)) > 1000 and int(slow.group(2)) > 0, res.stdout


def test_a_race_is_reported(tmp_path: Path):
    """The build and options do report: a program with a race of its own fails."""
    src = tmp_path / "race.c"
    src.write_text("#include <pthread.h>\nstatic int x;\n"
                   "static void *f(void *a) { x++; return a; }\n"
                   "int main(void) { pthread_t t; pthread_create(&t, 0, f, 0); x++;\n"
                   "  pthread_join(t, 0); return 0; }\n")
    subprocess.run(["gcc", "-fsanitize=thread", "-g", str(src), "-o", str(tmp_path / "race")],
                   check=True, timeout=60)
    res = subprocess.run([str(tmp_path / "race")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **threads_env()})
    if "FATAL: ThreadSanitizer" in res.stderr:
        pytest.skip("ThreadSanitizer cannot run here")
    assert res.returncode == 66 and "WARNING: ThreadSanitizer: data race" in res.stderr
