"""The security findings about the control plane, each reproduced against a live switch.

Numbers refer to the findings of docs/security.md. A switch runs in a thread of the test
(its limits and timeouts made small), or as a real process where its memory or its file
descriptors are the point.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time

import numpy as np
import psutil
import pytest

from dlcomm.errors import ExchangeError
from dlcomm.switch.client import ControlClient
from dlcomm.switch.groups import group_reaches
from dlcomm.switch.registrations import Limits
from dlcomm.switch.service import running_switches
from dlcomm.wire.packet import DATA, RESULT, Header, decode_header
from tests.switch.live import Line, live_switch, own_job

TOKEN = "s3cret-admin-token-0123456789"


def registration(port: int = 5000, **extra) -> dict:
    return {"op": "register", "addresses": [["127.0.0.1", port]], "slots": 1, "k": 4, **extra}


def wait_for(predicate, timeout: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def test_5_a_line_without_newline_is_cut_off_without_being_stored():
    """200 MiB without a newline once grew the switch by 206 MB: now the line is refused
    after 64 KiB and the connection closed; the switch's memory stays flat."""
    with running_switches("127.0.0.1") as service:
        address, fp = service.addresses[0], service.fingerprints[0]
        proc = psutil.Process(service.procs[0].pid)
        before = proc.memory_info().rss
        sent = 0
        with Line(address, fp) as line:
            chunk = b"x" * (1 << 20)
            with pytest.raises((OSError, ssl.SSLError)):
                for _ in range(200):
                    line.send_raw(chunk)
                    sent += len(chunk)
        grown = proc.memory_info().rss - before
        assert sent < 64 << 20 and grown < 16 << 20, (sent, grown)
        with Line(address, fp) as line:
            assert line.ask({"op": "ping"})["ok"]


def test_5_connections_are_capped_per_source():
    with live_switch(limits=Limits(max_connections_per_source=3)) as live:
        lines = [Line(live.address, live.fp) for _ in range(3)]
        with Line(live.address, live.fp) as extra:   # refused: closed at once
            with pytest.raises((OSError, ssl.SSLError)):
                extra.send({"op": "ping"})
                assert extra.recv(timeout=2) is None
                raise ConnectionResetError("closed by the switch")
        for line in lines:
            assert line.ask({"op": "ping"})["ok"]
            line.close()
        assert wait_for(lambda: live.server.control.connections == {})
        with Line(live.address, live.fp) as line:
            assert line.ask({"op": "ping"})["ok"]
        assert live.counter("control_refused_connections") >= 1


def test_5_running_out_of_file_descriptors_is_not_fatal():
    """40 idle connections under a 40-file limit once ended the control loop for good:
    now accept errors are retried (counted, logged once), and once the idle connections
    close, jobs register again. A scrape waiting meanwhile once spun a core (the exporter
    retried its failed accept at once); it waits too, and is answered afterwards."""
    from tests.switch.test_metrics import free_port

    mport = free_port()
    with running_switches("127.0.0.1", prefix=["prlimit", "--nofile=40:40", "--"],
                          extra_args=["--metrics", f"127.0.0.1:{mport}"]) as service:
        address, fp = service.addresses[0], service.fingerprints[0]
        switch = psutil.Process(service.procs[0].pid)   # prlimit execs the switch
        idle = []
        for _ in range(60):
            try:
                idle.append(socket.create_connection(address, timeout=2))
            except OSError:
                break
        time.sleep(1.5)
        scrape = socket.create_connection(("127.0.0.1", mport), timeout=10)
        scrape.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        before = sum(switch.cpu_times()[:2])
        time.sleep(2)
        busy_s = sum(switch.cpu_times()[:2]) - before
        for sock in idle:
            sock.close()
        with scrape:
            assert scrape.recv(64).startswith(b"HTTP/1.0 200")
        assert busy_s < 0.5, f"the switch used {busy_s:.2f} CPU-s in 2 s of a flood"

        last: list[object] = []

        def registers() -> bool:
            try:
                with Line(address, fp, timeout=2) as line:
                    reply = line.ask(registration(), timeout=2)
            except (OSError, ssl.SSLError, AssertionError) as exc:
                reply = exc
            last[:] = [reply]
            return isinstance(reply, dict) and bool(reply["ok"])

        registered = wait_for(registers, timeout=20, step=0.5)
        log = service.logs[0].read_text(errors="replace")
        assert registered, f"last answer {last[0]!r}; the switch's log ends:\n{log[-2000:]}"
        assert service.procs[0].poll() is None
        # the failed accepts were counted and logged once, not a traceback a second
        assert log.count("cannot accept a control connection (Too many open files)") == 1
        assert "Traceback" not in log
    assert service.final_stats[0]["counters"]["control_accept_errors"] >= 1


def test_5_every_request_is_checked_and_answered_in_one_line():
    bad = [{"op": "register"}, registration(slots=-1), registration(slots="1"),
           registration(k=True), registration(k=10**9), registration(name=["x"]),
           registration(block=3.5), registration(auth="rot13"), {"op": 7},
           {"op": "attach", "job": "1"}, {"op": "attach", "job": 1, "rank": 0, "ticket": "zz"},
           {"op": "heartbeat"}, {"op": "leave"}, {"op": "x" * 1000}]
    with live_switch() as live, Line(live.address, live.fp) as line:
        for request in bad:
            reply = line.ask(request)
            assert reply["ok"] is False and "\n" not in reply["error"], request
        assert line.ask({"op": "ping"})["ok"]


def test_6_a_client_that_never_reads_cannot_block_the_janitor():
    """It sends requests and never reads replies: meanwhile the janitor frees a silent job
    and others register as usual; the hog is dropped after the send timeout."""
    limits = Limits(send_timeout_s=4.0)
    with live_switch(limits=limits, job_timeout_s=1.0) as live:
        with Line(live.address, live.fp, timeout=0.5) as hog:
            for _ in range(100000):   # until the switch stops reading it
                try:
                    hog.send({"op": "stats"})
                except (OSError, ssl.SSLError):
                    break
            silent = own_job(live.address, live.fp, workers=1, k=4)
            start = time.monotonic()
            with Line(live.address, live.fp) as other:
                assert other.ask(registration(6000))["ok"]
            assert time.monotonic() - start < 1.0
            assert wait_for(lambda: str(silent.job) not in live.server.stats()["jobs"], 3)
            assert wait_for(lambda: live.counter("control_slow_readers_dropped") >= 1, 8)
        silent.close()


def test_7_a_stale_connection_cannot_end_a_new_job_with_its_number():
    with live_switch(job_timeout_s=1.0) as live:
        old = own_job(live.address, live.fp, workers=1, k=4)   # goes silent: timed out
        assert wait_for(lambda: str(old.job) not in live.server.stats()["jobs"], 8)
        table = live.server.state.table
        table.new_id = lambda: old.job                          # the next job: same number
        new = own_job(live.address, live.fp, workers=1, k=4)
        assert new.job == old.job
        old.close()                                             # the stale member goes
        time.sleep(0.5)
        new.lines[0].send({"op": "heartbeat"})
        new.send(0, Header(DATA, new.job, 0, 0, 1, 0, 0, 0), np.int32([4]).tobytes(),
                 live.address)
        new.socks[0].settimeout(2)
        data = new.socks[0].recv(1 << 16)
        assert decode_header(data).type == RESULT
        new.close()


def test_8_registration_needs_the_token_and_quotas_hold():
    limits = Limits(max_jobs=3, max_slots_per_job=4, registrations_per_minute=6)
    with live_switch(token=TOKEN, limits=limits, slots=8) as live, \
            Line(live.address, live.fp) as line:
        assert "admin token" in line.ask(registration())["error"]
        assert "admin token" in line.ask(registration(token="wrong"))["error"]
        assert "slots must be in 1..4" in line.ask(registration(slots=5, token=TOKEN))["error"]
        assert line.ask(registration(slots=4, token=TOKEN))["ok"]
        assert line.ask(registration(slots=2, token=TOKEN))["ok"]        # 6 of 8 slots
        full = line.ask(registration(slots=3, token=TOKEN))["error"]
        assert full.startswith("switch full") and "jobs already" not in full, full
        assert line.ask(registration(slots=1, token=TOKEN))["ok"]        # 7 of 8, 3 jobs
        jobs = line.ask(registration(slots=1, token=TOKEN))["error"]     # a slot is left
        assert jobs == "switch full: 3 jobs already", jobs
        assert "too many registrations" in line.ask(registration(token=TOKEN))["error"]


def test_8_a_job_that_never_goes_live_is_freed_despite_its_packets():
    with live_switch(limits=Limits(attach_s=1.0)) as live, Line(live.address, live.fp) as line:
        job = line.ask(registration())["job"]
        freed_at = None
        start = time.monotonic()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _ in range(80):   # probes for 4 s, that once refreshed the idle timer
                sock.sendto(Header(DATA, job, 0, 0, 0, 0, 0, 0, flags=1).pack() + bytes(17),
                            live.address)
                time.sleep(0.05)
                if freed_at is None and str(job) not in live.server.stats()["jobs"]:
                    freed_at = time.monotonic() - start
        assert freed_at is not None and freed_at < 3.5, freed_at   # freed while probed
        assert live.counter("drop_not_live") + live.counter("drop_unknown_job") == 80


def test_9_heartbeats_keep_a_quiet_job_and_silence_ends_it():
    with live_switch(job_timeout_s=1.5) as live:
        job = own_job(live.address, live.fp, workers=1, k=4)
        for _ in range(8):   # 4 s without a packet, with heartbeats
            assert job.lines[0].ask({"op": "heartbeat"})["ok"]
            time.sleep(0.5)
        assert str(job.job) in live.server.stats()["jobs"]
        event = job.lines[0].recv(timeout=8)     # silence: the job ends, the worker hears
        assert event == {"event": "job_timeout", "job": job.job}
        job.close()


def test_9_tcp_keepalive_on_both_ends():
    with live_switch() as live:
        client = ControlClient(live.address, live.fp)
        try:
            assert client.conn.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1

            def server_side() -> str:
                return subprocess.run(["ss", "-tnoH", "state", "established", "(", "sport",
                                       "=", f":{live.address[1]}", ")"], capture_output=True,
                                      text=True, timeout=10).stdout

            # (while a segment is unacknowledged, ss shows the retransmission timer instead)
            assert wait_for(lambda: "keepalive" in server_side(), 5), server_side()
        finally:
            client.close()


def test_11_parse_errors_are_answered_and_the_member_stays():
    with live_switch() as live:
        job = own_job(live.address, live.fp, workers=2, k=4)
        member = job.lines[0]
        for raw in (b"[" * 60000 + b"\n", b'{"op": "heartbeat", "x": Infinity}\n',
                    b'{"op": "challenge", "job": 1e400}\n', b'{"op": 1' + b"0" * 5000 + b"}\n",
                    b"\xff\xfe\n", b"[]\n", b"\n"):
            member.send_raw(raw)
            reply = member.recv()
            assert reply is not None and reply["ok"] is False, raw[:20]
        assert member.ask({"op": "heartbeat"})["ok"]
        assert job.lines[1].ask({"op": "heartbeat"})["ok"]   # its peer heard nothing bad
        assert live.server.stats()["jobs"][str(job.job)]["live"]
        job.close()


def test_13_stats_need_the_token_where_one_is_set():
    with live_switch(token=TOKEN) as live, Line(live.address, live.fp) as line:
        line.ask(registration(name="secret-project", token=TOKEN))
        refused = line.ask({"op": "stats"})
        assert refused["ok"] is False and "secret-project" not in str(refused)
        assert line.ask({"op": "stats", "token": TOKEN})["ok"]


def test_13_challenge_and_attach_do_not_tell_which_jobs_exist():
    """An unknown job, a rank beyond a live job's and a wrong ticket get the same answer,
    whatever else the request holds: no oracle for job numbers or their sizes."""
    with live_switch() as live, Line(live.address, live.fp) as line:
        job = own_job(live.address, live.fp, workers=2)
        free = next(j for j in range(1, 0xFFFF) if j != job.job)
        answers = set()
        for op in ("challenge", "attach"):
            for number in (job.job, free):
                for rank in (0, 1, 3, 1000):
                    for ticket in ("00" * 16, "11" * 16):
                        reply = line.ask({"op": op, "job": number, "rank": rank,
                                          "ticket": ticket, "nonce": "22" * 16})
                        assert reply["ok"] is False
                        answers.add(reply["error"])
        assert answers == {"no such job"}
        job.close()


def test_8_the_client_hears_refusals_at_once():
    """Refusals carry the request's id, so the real client reports "switch full", a wrong
    token or the rate limit at once, not as a switch that did not answer."""
    limits = Limits(max_jobs=1, registrations_per_minute=3)
    with live_switch(token=TOKEN, limits=limits) as live:
        client = ControlClient(live.address, live.fp, timeout=5.0)
        try:
            start = time.monotonic()
            with pytest.raises(ExchangeError, match="requires its admin token"):
                client.request(registration(token="wrong"))
            assert client.request(registration(token=TOKEN))["ok"]
            with pytest.raises(ExchangeError, match="switch full: 1 jobs already"):
                client.request(registration(port=5001, token=TOKEN))
            with pytest.raises(ExchangeError, match="slots must be in"):
                client.request(registration(slots=0, token=TOKEN))
            with pytest.raises(ExchangeError, match="too many registrations"):
                client.request(registration(token=TOKEN))
            assert time.monotonic() - start < 2.0
        finally:
            client.close(leave=False)


def test_a_group_is_granted_only_where_it_reaches_every_worker():
    """Workers of other hosts join a group on their interface; workers on loopback get it
    only from a switch whose groups leave through lo, which reach no other host; a worker on
    another address of the switch's own host would not hear it at all (results then go to
    each worker)."""
    remote = [("192.0.2.1", 4000), ("192.0.2.2", 4000)]   # TEST-NET: not this host
    loop = [("127.0.0.1", 4000), ("127.0.0.1", 4001)]
    local = [("10.9.9.9", 4000)]
    is_local = {"10.9.9.9": True}.get
    assert group_reaches(remote, False, lambda h: bool(is_local(h)))
    assert not group_reaches(loop, False, lambda h: bool(is_local(h)))
    assert group_reaches(loop, True, lambda h: bool(is_local(h)))
    assert not group_reaches(loop + remote, True, lambda h: bool(is_local(h)))  # through lo
    assert not group_reaches(local + remote, False, lambda h: bool(is_local(h)))
