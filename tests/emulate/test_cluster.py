"""Emulated clusters for real: namespaces, shaped links, guaranteed teardown (root only)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dlcomm.emulate import cluster as cluster_mod
from dlcomm.emulate.cluster import list_namespaces, temporary_cluster
from dlcomm.errors import ConfigError
from tests.conftest import dlcomm_cmd, dlcomm_namespaces, requires_root, run_dlcomm


def test_not_root_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(cluster_mod.os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="needs root.*--network loopback"):
        cluster_mod.require_root()


@requires_root
def test_temporary_cluster_is_removed_after_an_exception():
    with pytest.raises(RuntimeError):
        with temporary_cluster(2, 1e9) as c:
            assert set(c.plan.namespaces) <= set(list_namespaces())
            raise RuntimeError("boom")
    assert not [ns for ns in list_namespaces() if ns.startswith(f"dlcomm-p{os.getpid()}-")]


@requires_root
def test_leafspine_cluster_connects_hosts_across_racks():
    with temporary_cluster(4, 1e9, "leafspine:2:2:2") as c:
        code = f"import socket; s=socket.create_connection(('{c.address(3)}', 9)) "
        # h3 listens on a port; h0 (other rack) connects through leaf0 - spine - leaf1
        server = subprocess.Popen([*c.prefix(3), sys.executable, "-c",
                                   "import socket; s=socket.create_server(('0.0.0.0', 7000));"
                                   "c,_=s.accept(); c.sendall(b'hello')"])
        try:
            client = subprocess.run([*c.prefix(0), sys.executable, "-c",
                                     "import socket,time\n"
                                     "for _ in range(50):\n"
                                     "    try:\n"
                                     "        s=socket.create_connection("
                                     f"('{c.address(3)}', 7000)); break\n"
                                     "    except OSError: time.sleep(0.1)\n"
                                     "print(s.recv(5).decode())"],
                                    capture_output=True, text=True, timeout=30)
        finally:
            server.kill()
            server.wait()
        assert client.stdout.strip() == "hello", client.stderr + code


@requires_root
def test_cluster_check_reaches_configured_rate(job_tmp):
    res = run_dlcomm("cluster", "check", "--hosts", "2", "--bandwidth", "200mbit",
                     "--json", "c.json", tmp=job_tmp, timeout=120)
    assert res.returncode == 0, res.stderr
    s = json.loads((job_tmp / "c.json").read_text())["summary"]
    assert s["achieved_ratio"] >= 0.90 and s["goodput_ratio"] >= 0.90
    assert s["achieved_ratio"] <= 1.05  # the shaper holds the rate


@requires_root
def test_cluster_up_status_down_and_stale_collection(job_tmp):
    name = f"t{os.getpid() % 100000}"
    res = run_dlcomm("cluster", "up", "--hosts", "2", "--bandwidth", "1gbit", "--name", name,
                     tmp=job_tmp)
    try:
        assert res.returncode == 0, res.stderr
        assert f"dlcomm-{name}-h1" in dlcomm_namespaces()
        again = run_dlcomm("cluster", "up", "--hosts", "2", "--bandwidth", "1gbit", "--name",
                           name, tmp=job_tmp)
        assert again.returncode != 0 and "already exists" in again.stderr
        status = run_dlcomm("cluster", "status", tmp=job_tmp)
        assert f"dlcomm-{name}-sw" in status.stdout
        trained = run_dlcomm("train", "--workers", "2", "--steps", "3", "--quiet", "--network",
                             "emulated", "--cluster", name, tmp=job_tmp)
        assert trained.returncode == 0, trained.stderr
    finally:
        down = run_dlcomm("cluster", "down", "--name", name, tmp=job_tmp)
    assert down.returncode == 0
    assert not [ns for ns in dlcomm_namespaces() if ns.startswith(f"dlcomm-{name}-")]
    # a namespace of a dead owner is collected by the next cluster
    subprocess.run(["ip", "netns", "add", "dlcomm-p999999-h0"], check=True)
    with temporary_cluster(2, 1e9):
        assert "dlcomm-p999999-h0" not in list_namespaces()


@requires_root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_bench_removes_its_namespaces(job_tmp, sig):
    env = {**os.environ, "TMPDIR": str(job_tmp)}
    proc = subprocess.Popen(dlcomm_cmd("bench", "allreduce", "--workers", "2", "--size", "40MB",
                                       "--reps", "50", "--network", "emulated", "--bandwidth",
                                       "100mbit", "--json", "b.json"),
                            cwd=job_tmp, env=env, stderr=subprocess.PIPE, text=True)
    prefix = f"dlcomm-p{proc.pid}-"
    deadline = time.monotonic() + 60
    while not any(ns.startswith(prefix) for ns in dlcomm_namespaces()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    time.sleep(3)  # workers running
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert not any(ns.startswith(prefix) for ns in dlcomm_namespaces())
    assert not (job_tmp / "b.json").exists()


def test_emulated_needs_bandwidth_or_cluster(job_tmp):
    res = run_dlcomm("train", "--network", "emulated", tmp=job_tmp)
    assert res.returncode == 2 and "needs --bandwidth" in res.stderr


@requires_root
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_cluster_is_built_leaves_no_namespace(sig):
    """The handlers are in place before the first namespace is made: a signal in the middle
    of the build removes what was built."""
    code = ("import time; from dlcomm.emulate.cluster import temporary_cluster\n"
            "with temporary_cluster(32, 1e9):\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    mine = f"dlcomm-p{proc.pid}-"
    deadline = time.monotonic() + 60
    while not [ns for ns in dlcomm_namespaces() if ns.startswith(mine)]:
        assert proc.poll() is None and time.monotonic() < deadline, "no namespace appeared"
        time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert f"Interrupted: interrupted by {sig.name}" in err
    assert not [ns for ns in dlcomm_namespaces() if ns.startswith(mine)]
