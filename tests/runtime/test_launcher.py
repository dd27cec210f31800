"""The launcher's root cause, as a pure function, and the launcher on small real jobs."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlcomm.errors import ConfigError, WorkerFailed
from dlcomm.runtime.failures import Report, describe_failure, is_peer_failure
from dlcomm.runtime.launcher import RankState, root_cause


def own(rank: int, t: float, rc: int | None = 1) -> RankState:
    return RankState(rank, rc, Report(f"RuntimeError: rank {rank}", False, t), t)


def peer(rank: int, t: float, rc: int | None = 1) -> RankState:
    return RankState(rank, rc, Report(f"gloo: connection closed (rank {rank})", True, t), t)


def died(rank: int, t: float, rc: int = -9) -> RankState:
    return RankState(rank, rc, None, t)


def test_own_error_outranks_a_peer_killed_by_a_signal_after_it():
    """The flake seen in CI: rank 1 raised; a peer then aborted (SIGABRT, gloo's
    IoException) and was seen dead first. The own report names the job's failure."""
    ranks = [died(0, 10.000, rc=-6), own(1, 10.010), died(2, 10.001, rc=-6),
             RankState(3)]
    assert root_cause(ranks).rank == 1


def test_a_death_without_report_outranks_the_peers_that_noticed_it():
    """kill -9 on rank 2: its peers report broken connections (a peer's failure)."""
    ranks = [peer(0, 5.02), peer(1, 5.01), died(2, 5.05), peer(3, 5.03)]
    assert root_cause(ranks).rank == 2


def test_an_exit_without_report_outranks_peer_reports():
    ranks = [peer(0, 1.0), died(3, 1.2, rc=3)]
    assert root_cause(ranks).cause() == "exited with code 3"


def test_earliest_first_within_a_kind_then_the_lowest_rank():
    assert root_cause([own(2, 3.0), own(1, 4.0)]).rank == 2
    assert root_cause([own(2, 3.0), own(1, 3.0)]).rank == 1
    assert root_cause([peer(3, 2.0), peer(0, 2.5)]).rank == 3


def test_a_running_rank_that_reported_counts_and_success_does_not():
    reporting = RankState(1, None, Report("ValueError: x", False, 1.0))
    assert root_cause([RankState(0, 0), reporting]).rank == 1
    assert root_cause([RankState(0, 0), RankState(1)]) is None


def test_cause_text():
    assert own(1, 1.0).cause() == "RuntimeError: rank 1 (exited with code 1)"
    assert died(2, 1.0).cause() == "killed by signal SIGKILL"
    assert RankState(4, 2, None, 1.0, "Traceback ...").cause() == \
        "exited with code 2; last output: Traceback ..."


kinds = st.sampled_from(["own", "peer", "died", "running", "ok"])


@given(st.lists(st.tuples(kinds, st.floats(0, 100)), min_size=1, max_size=8))
def test_root_cause_follows_the_documented_order(events):
    """For any mix of outcomes: an own report if any (earliest, lowest rank), else a death
    without report, else a peer report; the order the ranks are listed in does not matter."""
    make = {"own": own, "peer": peer, "died": died,
            "running": lambda r, t: RankState(r), "ok": lambda r, t: RankState(r, 0)}
    ranks = [make[kind](i, t) for i, (kind, t) in enumerate(events)]
    got = root_cause(ranks)
    for kind in ("own", "died", "peer"):
        of_kind = [(t, i) for i, (k, t) in enumerate(events) if k == kind]
        if of_kind:
            assert got is not None and got.rank == min(of_kind)[1]
            break
    else:
        assert got is None
    for order in itertools.islice(itertools.permutations(ranks), 6):
        assert root_cause(list(order)) is got


def test_failures_are_classified_as_own_or_a_peers():
    from dlcomm.errors import ExchangeError, ExchangeTimeout

    assert not is_peer_failure(RuntimeError("injected fault at step 5"))
    assert not is_peer_failure(ValueError("x"))
    assert is_peer_failure(ExchangeTimeout("rank 2 did not answer"))
    assert is_peer_failure(ExchangeError("worker rank 1 left the job"))
    assert is_peer_failure(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                                        "Connection closed by peer [127.0.0.1]:427"))
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError as exc:
        line = describe_failure(exc)
    assert line.startswith("RuntimeError: boom second line (at test_launcher.py:")
    assert "\n" not in line


def run_job(tmp_path, plan: dict, workers: int = 3, **kw) -> None:
    """A real job of ``tests.runtime.rank_body`` ranks (each does what ``plan`` says), its
    job directory under ``tmp_path``."""
    import tempfile

    from dlcomm.runtime.launcher import launch

    saved, tempfile.tempdir = tempfile.tempdir, str(tmp_path)
    try:
        launch(plan, workers, entry=(), module="tests.runtime.rank_body",
               rank0_output=False, **kw)
    finally:
        tempfile.tempdir = saved


def no_job_dirs(tmp_path) -> bool:
    return not [p for p in tmp_path.iterdir() if p.name.startswith("dlcomm-")]


def test_a_job_that_succeeds(tmp_path):
    """Its directory is made under $TMPDIR and removed at the end."""
    seen = []
    run_job(tmp_path, {"0": "ok", "1": "ok", "record": str(tmp_path / "seen")}, workers=2)
    seen = (tmp_path / "seen").read_text().split()
    assert seen and all(s.startswith(str(tmp_path / "dlcomm-job-")) for s in seen)
    assert no_job_dirs(tmp_path)


def test_own_error_then_peers_abort_names_the_raiser(tmp_path):
    """Rank 1 raises; the others then die by SIGABRT, as gloo's IoException makes them, and
    usually before rank 1 has exited. The job names rank 1, whatever the order."""
    plan = {"1": "raise", "0": "abort-after:0.05", "2": "abort-after:0.05"}
    with pytest.raises(WorkerFailed) as info:
        run_job(tmp_path, plan)
    assert info.value.rank == 1
    assert "RuntimeError: injected by the plan" in info.value.cause
    assert no_job_dirs(tmp_path)


def test_a_killed_rank_is_named_before_the_peers_that_noticed(tmp_path):
    plan = {"2": "kill", "0": "peer-error-after:0.05", "1": "peer-error-after:0.05"}
    with pytest.raises(WorkerFailed, match="worker rank 2 failed: killed by signal SIGKILL"):
        run_job(tmp_path, plan)


def test_the_deadline_stops_a_hung_job(tmp_path):
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match="did not finish within 2 s"):
        run_job(tmp_path, {"0": "hang", "1": "hang"}, workers=2, deadline_s=2)
    assert time.monotonic() - start < 15
    assert no_job_dirs(tmp_path)


def test_a_port_in_use_is_a_one_line_error(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is not available"):
            run_job(tmp_path, {"0": "ok"}, workers=1, master_port=port)


def test_ranks_die_with_a_killed_launcher(tmp_path):
    """kill -9 on the launcher: its ranks go too (PR_SET_PDEATHSIG), none is left."""
    code = ("import sys, tempfile; tempfile.tempdir = sys.argv[1]; "
            "from dlcomm.runtime.launcher import launch; "
            "launch({'0': 'hang', '1': 'hang'}, 2, entry=(), module='tests.runtime.rank_body', "
            "rank0_output=False)")
    launcher = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)],
                                cwd=str(REPO))
    ranks = wait_for_ranks(tmp_path, 2)
    launcher.kill()
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in ranks)


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_for_ranks(tmp_path, count: int, timeout_s: float = 60) -> list:
    from tests.conftest import processes_mentioning

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [p for p in processes_mentioning("tests.runtime.rank_body")
                 if str(tmp_path) in " ".join(p.cmdline())]
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError("the ranks did not start")


def alive(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
