"""Bad input on the command line: one line, ``dlcomm: error: ...``, exit code 2, before any
work starts; and a Ctrl-C while the libraries still load is one line too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dlcomm.cli import main
from tests.conftest import dlcomm_cmd

BAD = {
    "bench switch: --seconds nan": (["bench", "switch", "--seconds", "nan"], "--seconds"),
    "bench switch: --seconds inf": (["bench", "switch", "--seconds", "inf"], "--seconds"),
    "bench switch: more workers than the load generator plays":
        (["bench", "switch", "--workers", "4,65"], "at most 64 workers"),
    "bench allreduce: --timeout-s 0": (["bench", "allreduce", "--timeout-s", "0"], "--timeout-s"),
    "bench allreduce: --timeout-s nan":
        (["bench", "allreduce", "--timeout-s", "nan"], "--timeout-s"),
    "switch serve: --stats-file in a missing directory":
        (["switch", "serve", "--bind", "127.0.0.1:0", "--stats-file", "{tmp}/no/s.json"],
         "--stats-file"),
    "advise: --plot in a missing directory":
        (["advise", "--workload", "resnet50", "--plot", "{tmp}/no/p.png"], "--plot"),
    "advise: both --workload and --model":
        (["advise", "--workload", "resnet50", "--model", "os.path:join"], "not both"),
    "cluster down: a name no cluster can have":
        (["cluster", "down", "--name", "BAD NAME"], "must be 1-12"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_code_2(case, tmp_path, capsys):
    argv, words = BAD[case]
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("dlcomm: error: ") and words in err
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (cluster state)")
def test_cluster_down_of_a_cluster_that_is_not_there():
    assert main(["cluster", "down", "--name", "nosuchlab"]) == 2


@pytest.mark.parametrize("after_s", [0.3, 0.7, 1.2])
def test_ctrl_c_while_the_libraries_load_is_one_line(after_s, tmp_path):
    """While torch loads (0.3, 0.7 s) and once the command runs (1.2 s): one line, exit
    code 130, no abort from torch's C++ import code and no end by SIGINT. The child gets
    Python's default SIGINT handler (the test's own may be SIG_IGN in a background job)."""
    proc = subprocess.Popen(dlcomm_cmd("bench", "allreduce", "--workers", "2", "--size", "1MB"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1].strip()
    assert proc.returncode == 130, err
    assert len(err.splitlines()) == 1 and err.startswith("dlcomm: error: interrupted"), err
    assert not any(tmp_path.iterdir())


def test_a_second_ctrl_c_ends_an_import_that_hangs(tmp_path):
    """The first Ctrl-C while the libraries load is only noted (the import goes on); if the
    import hangs, a second one ends the command at once, as interrupted."""
    (tmp_path / "hangs.py").write_text("import time\nwhile True:\n    time.sleep(0.05)\n")
    code = (f"import builtins, sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            "import dlcomm.entry\nreal = builtins.__import__\n"
            "def imp(name, *a, **k):\n"
            "    if name == 'dlcomm.cli':\n        import hangs\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imp\nraise SystemExit(dlcomm.entry.main())\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None                  # noted: the import goes on
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=10)[1].strip()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and err == "dlcomm: error: interrupted", err
