"""Failures inside the switch: what it survives, and what stops it with its reason.

A log it cannot write, or a new job's slots it cannot allocate, leave it serving (and
leave nothing half-made); a packet loop that cannot start stops the whole switch with the
reason, so that a service manager restarts it, rather than leave it up without that loop.
A scrape of its statistics, on the exporter's thread, survives the event loop's thread
adding and removing registrations and connections meanwhile.
"""

from __future__ import annotations

import errno
import io
import signal
import sys
import threading
from collections import Counter

import pytest

from dlcomm.errors import DlcommError
from dlcomm.switch import daemon
from dlcomm.switch.jobs import JobTable
from dlcomm.switch.log import say_once
from dlcomm.switch.registrations import Registration, registration_stats
from dlcomm.switch.security import identity
from dlcomm.switch.server import SwitchServer
from tests.switch.live import Line, live_switch
from tests.switch.test_findings_control import registration

LIMITS = {"max_workers": 8, "max_jobs": 8, "max_slots_per_job": 8, "max_registrations": 60,
          "max_connections": 64, "max_connections_per_source": 64}


class BrokenStream(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("stream", ["full", "closed"])
def test_a_log_that_cannot_be_written_is_not_fatal(monkeypatch, stream):
    broken = BrokenStream() if stream == "full" else io.StringIO()
    if stream == "closed":
        broken.close()
    monkeypatch.setattr(sys, "stderr", broken)
    said: set[str] = set()
    say_once(said, "recv_errors", "receiving failed")
    say_once(said, "recv_errors", "receiving failed again")
    assert said == {"recv_errors"}


def test_the_first_event_of_a_kind_is_said_once(capsys):
    said: set[str] = set()
    for _ in range(3):
        say_once(said, "control_accept_errors", "cannot accept")
    err = capsys.readouterr().err
    assert err == ("dlcomm switch: cannot accept (counted as control_accept_errors; later ones "
                   "are only counted)\n")


@pytest.mark.parametrize("dataplane", ["native", "python"])
def test_a_job_whose_slots_cannot_be_allocated_leaves_nothing_behind(dataplane):
    with live_switch(dataplane=dataplane) as live:
        server = live.server
        if dataplane == "native":
            assert server.core is not None
            real = server.core.add_job

            def add_job(spec):   # as the C code answers when calloc fails
                raise MemoryError(f"cannot allocate job {spec.job_id}'s slots")
            server.core.add_job = add_job  # type: ignore[method-assign]
        else:
            real = server.state.dataplane.add_job

            def add_job(job):    # the job half made, then no memory
                real(job)
                raise MemoryError()
            server.state.dataplane.add_job = add_job  # type: ignore[method-assign]
        with Line(live.address, live.fp) as line:
            reply = line.ask(registration())
        assert not reply["ok"] and reply["error"].startswith("switch full:"), reply
        assert server.state.table.jobs == {} and server.state.table.slots_in_use() == 0
        assert not getattr(server.state.dataplane, "native", {})
        if dataplane == "native":
            server.core.add_job = real  # type: ignore[method-assign]
        else:
            server.state.dataplane.add_job = real  # type: ignore[method-assign]
        with Line(live.address, live.fp) as line:
            assert line.ask(registration())["ok"]


def test_a_packet_loop_that_cannot_start_stops_the_switch_with_its_reason():
    server = SwitchServer("127.0.0.1", 0, identity("127.0.0.1"), slots=16, dataplane="native")
    assert server.core is not None

    def serve(fd, drop_rate=0.0, seed=0, gro=None):
        raise MemoryError("cannot allocate a native packet loop")
    server.core.serve = serve  # type: ignore[method-assign]
    ended: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as exc:  # noqa: BLE001 (the test looks at it)
            ended.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(15)
    alive = thread.is_alive()
    if alive:
        server.stop()
        thread.join(10)
    assert not alive, "the switch served on without its packet loop"
    assert len(ended) == 1 and isinstance(ended[0], MemoryError), ended
    assert server.udp.fileno() == -1 and server._loop is not None and server._loop.is_closed()
    assert not server.core.handle, "the native switch was not freed after its threads ended"


class FakeServer:
    """What daemon.serve needs of a SwitchServer; ``run`` ends as told."""

    failure: BaseException | None = None

    def __init__(self, *args, **kwargs) -> None:
        self.address = ("127.0.0.1", 9)

    def run(self) -> None:
        if self.failure is not None:
            raise self.failure

    def stop(self) -> None:
        pass

    def stats(self) -> dict:
        return {"counters": {}}


@pytest.mark.parametrize("failure", [None, RuntimeError("the control plane failed")])
def test_a_statistics_file_that_cannot_be_written_is_one_line(monkeypatch, capsys, tmp_path,
                                                              failure):
    def write_json(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr("dlcomm.switch.server.SwitchServer", FakeServer)
    monkeypatch.setattr(FakeServer, "failure", failure)
    monkeypatch.setattr("dlcomm.results.write_json", write_json)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    stats = tmp_path / "stats.json"
    with pytest.raises(DlcommError) as raised:
        try:
            raise KeyError("a caller's own exception, being handled")
        except KeyError:   # not mistaken for the reason the switch ended
            daemon.serve("127.0.0.1:0", 16, None, 0.0, 0, 60.0, None, None, None, None,
                         str(stats), True, LIMITS)
    problem = f"cannot write the statistics file {stats}: No space left on device"
    if failure is None:   # the one reason the command fails
        assert str(raised.value) == problem
    else:                 # the reason the switch ended stands, the file's problem is a line
        assert str(raised.value) == f"the switch stopped: {failure!r}"
        assert capsys.readouterr().err == f"dlcomm switch: {problem}\n"


def test_statistics_are_read_while_another_thread_changes_the_registrations():
    """The exporter's thread reads the registrations and the connection counts while the
    event loop's thread changes them: each is copied in one step, so no read sees a dict
    change size under it. (A comprehension walking ``registrations.items()`` failed this
    about 135 times in 20,000 reads, with the interpreter switching threads every
    microsecond.)"""
    table = JobTable(64, 256)
    jobs = [table.register([("127.0.0.1", 5000 + 2 * i), ("127.0.0.1", 5001 + 2 * i)], 1, 256)
            for i in range(8)]
    registrations: dict[int, Registration] = {}
    connections: Counter[str] = Counter()
    stop = threading.Event()

    def come_and_go() -> None:
        i = 0
        while not stop.is_set():
            job = jobs[i % len(jobs)]
            registrations[job.job_id] = Registration(job, [], [], 0.0)
            connections[f"10.0.0.{i % 40}"] += 1
            if len(registrations) > 4:
                registrations.pop(next(iter(registrations)))
            if len(connections) > 20:
                del connections[next(iter(connections))]
            i += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    churn = threading.Thread(target=come_and_go)
    churn.start()
    try:
        for _ in range(20_000):
            stats = registration_stats(registrations, connections)
            assert len(stats["registrations"]) <= 5 and stats["connections"] >= 0
    finally:
        stop.set()
        churn.join()
        sys.setswitchinterval(interval)
