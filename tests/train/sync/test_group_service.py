"""The Group Generator service under hostile input (security finding 12), on real sockets.

Each test drives a :class:`GroupService` with a real :class:`StaticSchedule` (two workers,
one group {0, 1}; every ask is answered at once, round r for a worker's r-th ask) and
plays the attacker with a raw socket on 127.0.0.1: a refused connection gets one error
line and is closed, the service and the honest workers go on.
"""

from __future__ import annotations

import hmac
import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from dlcomm.errors import ExchangeError
from dlcomm.train.sync.group_protocol import (
    HELLO_TIMEOUT_S,
    MAX_LINE_BYTES,
    SEND_TIMEOUT_S,
    ProtocolError,
    ServiceLimits,
    check_message,
    connection_cap,
    parse_line,
    token_matches,
)
from dlcomm.train.sync.prague import Delivery, StaticSchedule
from dlcomm.train.sync.service import GroupClient, GroupService

TOKEN = "0123456789abcdef" * 2
READY = b'{"op": "ready", "steps": 1, "final": false}'


def hello(rank: int, token: Any = TOKEN) -> bytes:
    return json.dumps({"op": "hello", "rank": rank, "token": token}).encode()


@contextmanager
def serving(generator: StaticSchedule | None = None, **limits: Any) -> Iterator[GroupService]:
    service = GroupService(generator or StaticSchedule(2, 2), "127.0.0.1", TOKEN,
                           ServiceLimits(**limits))
    try:
        yield service
    finally:
        service.close()


class Raw:
    """The attacker: a plain socket speaking lines."""

    def __init__(self, address: tuple[str, int], rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(5.0)
        self.sock.connect(address)

    def send(self, *lines: bytes) -> None:
        self.sock.sendall(b"".join(line + b"\n" for line in lines))

    def read_until_closed(self) -> list[dict[str, Any]]:
        """Every line the service sends before it closes (fails after 5 s without EOF)."""
        data = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
        return [json.loads(line) for line in data.split(b"\n") if line]

    def refusal(self) -> str:
        """The one error line of a refused connection (then closed here too)."""
        lines = self.read_until_closed()
        self.close()
        assert len(lines) == 1 and set(lines[0]) == {"error"}, lines
        return str(lines[0]["error"])

    def close(self) -> None:
        self.sock.close()


def client(service: GroupService, rank: int, token: str = TOKEN) -> GroupClient:
    return GroupClient(service.address, rank, timeout_s=5, token=token)


def assert_serves(service: GroupService, ranks: tuple[int, ...] = (0, 1)) -> None:
    """Honest workers of ``ranks`` (not connected yet) still get their groups."""
    clients = [client(service, r) for r in ranks]
    try:
        for c in clients:
            assert c.ask(1, final=False).members == (0, 1)
    finally:
        for c in clients:
            c.close()
    assert service.error is None


# -- 1. authentication ----------------------------------------------------------------

@pytest.mark.parametrize("token", ["f" * 32, TOKEN[:-1], "", "é" * 16, "\ud800", 7, None])
def test_a_hello_without_the_job_token_cannot_take_a_rank(token):
    with serving() as service:
        worker = client(service, 1)
        assert worker.ask(1, final=False).round == 0          # its hello has been taken
        attacker = Raw(service.address)
        attacker.send(hello(1, token), READY)
        assert "token" in attacker.refusal()
        assert worker.ask(2, final=False).round == 1          # still rank 1's answers
        worker.close()
        assert_serves(service, (0,))


def test_a_hello_with_no_token_field_is_refused():
    with serving() as service:
        attacker = Raw(service.address)
        attacker.send(b'{"op": "hello", "rank": 0}')
        assert attacker.refusal() == "hello needs the job token (a string)"
        assert_serves(service)


def test_a_second_hello_for_a_connected_rank_is_refused():
    with serving() as service:
        worker = client(service, 1)
        assert worker.ask(1, final=False).round == 0
        attacker = Raw(service.address)
        attacker.send(hello(1), READY)                        # even with the right token
        assert attacker.refusal() == "rank 1 is already connected"
        assert worker.ask(2, final=False).round == 1          # the first keeps the rank
        again = Raw(service.address)
        again.send(hello(0), hello(0))                        # twice on one connection
        assert again.refusal() == "this connection already said hello (rank 0)"
        worker.close()
        assert_serves(service, (0,))


def test_ready_before_hello_is_refused():
    with serving() as service:
        attacker = Raw(service.address)
        attacker.send(b'{"op": "ready", "rank": 1, "steps": 1, "final": true}')
        assert attacker.refusal() == "say hello first"
        assert_serves(service)
        assert not service.generator.stopped                  # its "final" was not taken


def test_ready_is_for_the_rank_of_its_connection():
    with serving() as service:
        rank0 = Raw(service.address)
        rank0.send(hello(0), READY)                           # no rank field: its connection's
        line = rank0.sock.recv(65536)
        assert json.loads(line) == {"group": [0, 1], "seq": 0, "round": 0}
        rank0.send(b'{"op": "ready", "rank": 1, "steps": 1, "final": false}')
        assert rank0.refusal() == "this connection is rank 0, not 1"
        worker = client(service, 1)
        assert worker.ask(1, final=False).round == 0          # rank 1 has not moved on
        worker.close()


def test_the_client_reports_the_service_refusal():
    with serving() as service:
        stranger = client(service, 1, token="x" * 32)
        with pytest.raises(ExchangeError, match="refused rank 1: wrong job token"):
            stranger.ask(1, final=False)
        holder = client(service, 0)
        assert holder.ask(1, final=False).round == 0
        twin = client(service, 0)
        with pytest.raises(ExchangeError, match="refused rank 0: rank 0 is already connected"):
            twin.ask(1, final=False)
        for c in (stranger, holder, twin):
            c.close()


# -- 2. one message, one exception boundary --------------------------------------------

AFTER_HELLO = {
    "not json": b"not json",
    "empty line": b"",
    "array": b"[1, 2]",
    "string": b'"ready"',
    "invalid utf-8": b"\xff\xfe{}",
    "unknown op": b'{"op": "jump"}',
    "no op": b'{"steps": 1}',
    "no final": b'{"op": "ready", "steps": 1}',
    "no steps": b'{"op": "ready", "final": false}',
    "steps string": b'{"op": "ready", "steps": "1", "final": false}',
    "steps bool": b'{"op": "ready", "steps": true, "final": false}',
    "steps float": b'{"op": "ready", "steps": 1.5, "final": false}',
    "steps negative": b'{"op": "ready", "steps": -1, "final": false}',
    "steps huge": b'{"op": "ready", "steps": 9223372036854775808, "final": false}',
    "steps digits": b'{"op": "ready", "steps": ' + b"9" * 5000 + b', "final": false}',
    "final int": b'{"op": "ready", "steps": 1, "final": 1}',
    "rank bool": b'{"op": "ready", "rank": false, "steps": 1, "final": false}',
    "NaN": b'{"op": "ready", "steps": NaN, "final": false}',
    "Infinity": b'{"op": "ready", "steps": Infinity, "final": false}',
    "-Infinity elsewhere": b'{"op": "ready", "steps": 1, "final": false, "x": -Infinity}',
    "deep nesting": b"[" * 60000,
    "deep object": b"{\"a\": " * 8000 + b"1" + b"}" * 8000,
}
HELLOS = {
    "rank too big": hello(2),
    "rank negative": hello(-1),
    "rank bool": hello(True),
    "rank string": hello("0"),
    "rank float": hello(0.0),
    "no rank": b'{"op": "hello", "token": "' + TOKEN.encode() + b'"}',
}


@pytest.mark.parametrize("line", AFTER_HELLO.values(), ids=AFTER_HELLO.keys())
def test_a_malformed_message_closes_only_its_connection(line):
    with serving() as service:
        bystander = client(service, 1)
        attacker = Raw(service.address)
        attacker.send(hello(0), line, READY)                 # nothing after it is taken
        assert attacker.refusal()
        assert bystander.ask(1, final=False).round == 0
        bystander.close()
        assert_serves(service, (0,))


@pytest.mark.parametrize("line", HELLOS.values(), ids=HELLOS.keys())
def test_a_malformed_hello_is_refused(line):
    with serving() as service:
        attacker = Raw(service.address)
        attacker.send(line)
        assert "rank" in attacker.refusal()
        assert_serves(service)


def test_a_failing_generator_still_stops_the_service():
    class Broken(StaticSchedule):
        def _ready(self, rank: int, now: float) -> list[Delivery]:
            raise RuntimeError("a bug")

    with serving(Broken(2, 2)) as service:
        worker = client(service, 0)
        with pytest.raises(ExchangeError, match="lost the group generator"):
            worker.ask(1, final=False)
        worker.close()
    assert service.error == "prague group generator failed: RuntimeError: a bug"


def test_message_checks():
    assert parse_line(b' {"op": "ready"}\r') == {"op": "ready"}
    with pytest.raises(ProtocolError, match="JSON constant NaN"):
        parse_line(b"NaN")
    ready = check_message({"op": "ready", "rank": 3, "steps": 0, "final": True}, 4, 3)
    assert (ready.steps, ready.final) == (0, True)
    with pytest.raises(ProtocolError, match=r"'rank' = 4 is outside 0..3"):
        check_message({"op": "hello", "rank": 4, "token": "t"}, 4, None)
    assert token_matches(TOKEN, TOKEN) and not token_matches("é", TOKEN)


def test_tokens_are_compared_in_constant_time(monkeypatch):
    import dlcomm.train.sync.group_protocol as protocol
    calls = []
    real = hmac.compare_digest

    class Spy:
        @staticmethod
        def compare_digest(a, b):
            calls.append((len(a), len(b)))
            return real(a, b)

    monkeypatch.setattr(protocol, "hmac", Spy)
    assert token_matches(TOKEN, TOKEN) and not token_matches("x" * 32, TOKEN)
    assert calls == [(32, 32), (32, 32)]


# -- 3. limits ------------------------------------------------------------------------

def test_a_line_of_the_limit_is_served():
    assert MAX_LINE_BYTES == 64 * 1024
    with serving() as service:
        worker = Raw(service.address)
        worker.send(hello(0), READY + b" " * (MAX_LINE_BYTES - len(READY)))
        assert json.loads(worker.sock.recv(65536))["round"] == 0
        worker.close()


@pytest.mark.parametrize("newline", [False, True], ids=["no newline yet", "whole line"])
def test_a_line_over_the_limit_is_refused(newline):
    with serving() as service:
        attacker = Raw(service.address)
        attacker.sock.sendall(b"x" * (MAX_LINE_BYTES + 1) + (b"\n" if newline else b""))
        assert attacker.refusal() == f"a line is at most {MAX_LINE_BYTES} bytes"
        assert_serves(service)


def test_a_connection_without_hello_is_closed():
    assert HELLO_TIMEOUT_S == 10.0
    with serving(hello_timeout_s=0.3) as service:
        silent = Raw(service.address)
        t0 = time.monotonic()
        assert silent.refusal() == "no hello within 0.3 s"
        assert 0.25 <= time.monotonic() - t0 < 3.0
        assert_serves(service)                      # workers that said hello stay


def test_connections_beyond_the_cap_are_refused():
    assert connection_cap(2) == 24
    with serving(max_connections=3) as service:
        assert service.max_connections == 3
        workers = [client(service, r) for r in (0, 1)]
        idle = Raw(service.address)
        extra = Raw(service.address)
        assert extra.refusal() == "too many connections (at most 3)"
        assert [w.ask(1, final=False).round for w in workers] == [0, 0]
        for w in workers:
            w.close()
        idle.close()


def test_a_worker_that_does_not_read_is_dropped():
    assert SEND_TIMEOUT_S == 5.0
    with serving(send_timeout_s=0.5) as service:
        reader = client(service, 0)
        hog = Raw(service.address, rcvbuf=4096)
        hog.send(hello(1))
        hog.sock.settimeout(0.2)
        pending = (READY + b"\n") * 500
        dropped = False
        deadline = time.monotonic() + 15.0
        while not dropped and time.monotonic() < deadline:   # asks, never reads the answers
            try:
                pending = pending[hog.sock.send(pending):] or (READY + b"\n") * 500
            except TimeoutError:
                continue                                     # the service is blocked on us
            except OSError:                                  # reset: it dropped us
                dropped = True
        assert dropped
        assert reader.ask(1, final=False).round == 0         # the service goes on
        reader.close()
        hog.close()
        assert_serves(service, (1,))                         # the rank is free again
