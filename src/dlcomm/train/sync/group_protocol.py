"""The Group Generator service's wire: message checks, answer lines, limits. Pure.

The protocol and its limits are described in :mod:`dlcomm.train.sync.service`; here a
line comes in as bytes and leaves as a :class:`Hello`, a :class:`Ready` or a
:class:`ProtocolError` whose text goes back to the sender in an error line.
"""

from __future__ import annotations

import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any, NoReturn

from dlcomm.train.sync.prague import Delivery

__all__ = ["ServiceLimits", "ProtocolError", "Hello", "Ready", "new_token", "connection_cap",
           "token_matches", "parse_line", "check_message", "reply_line", "error_line", "show",
           "MAX_LINE_BYTES", "HELLO_TIMEOUT_S", "SEND_TIMEOUT_S", "LINGER_S",
           "SEND_BUFFER_BYTES", "MAX_STEPS"]

MAX_LINE_BYTES = 64 * 1024     # the longest line a worker may send
HELLO_TIMEOUT_S = 10.0         # a connection must say hello within this
SEND_TIMEOUT_S = 5.0           # a worker that does not read its answers this long is dropped
LINGER_S = 1.0                 # a refused connection is drained this long for its error line
SEND_BUFFER_BYTES = 64 * 1024  # kernel send buffer per connection (answers are ~50 bytes)
MAX_STEPS = 2 ** 63 - 1


def connection_cap(world_size: int) -> int:
    """How many connections the service holds at once."""
    return 4 * world_size + 16


@dataclass(frozen=True)
class ServiceLimits:
    """The service's bounds (the module constants; tests shorten them)."""

    max_line_bytes: int = MAX_LINE_BYTES
    hello_timeout_s: float = HELLO_TIMEOUT_S
    send_timeout_s: float = SEND_TIMEOUT_S
    linger_s: float = LINGER_S
    send_buffer_bytes: int = SEND_BUFFER_BYTES
    max_connections: int | None = None       # None: connection_cap(world size)


class ProtocolError(Exception):
    """A message the service refuses; the text goes back to its sender."""


@dataclass(frozen=True)
class Hello:
    rank: int
    token: str


@dataclass(frozen=True)
class Ready:
    steps: int
    final: bool


def new_token() -> str:
    """A fresh random job token."""
    return secrets.token_hex(16)


def token_matches(given: str, expected: str) -> bool:
    """Constant-time comparison of a hello's token with the job's."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


def show(value: object) -> str:
    """``repr(value)``, cut to 40 characters for an error line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _no_constants(name: str) -> NoReturn:
    raise ProtocolError(f"JSON constant {name} is not allowed")


def parse_line(line: bytes) -> dict[str, Any]:
    """One message line as a JSON object, or ProtocolError."""
    try:
        msg = json.loads(line, parse_constant=_no_constants)
    except RecursionError:
        raise ProtocolError("message nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise ProtocolError(f"malformed JSON: {show(str(exc))}") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"a message must be a JSON object, not {type(msg).__name__}")
    return msg


def _int_field(msg: dict[str, Any], key: str, lo: int, hi: int) -> int:
    value = msg.get(key)
    if type(value) is not int:  # bool is an int subclass: refused too
        raise ProtocolError(f"{key!r} must be an integer, got {show(value)}")
    if not lo <= value <= hi:
        raise ProtocolError(f"{key!r} = {show(value)} is outside {lo}..{hi}")
    return value


def check_message(msg: dict[str, Any], world_size: int, rank: int | None) -> Hello | Ready:
    """The request in ``msg`` from a connection that said hello as ``rank`` (None: not yet)."""
    op = msg.get("op")
    if op == "hello":
        if rank is not None:
            raise ProtocolError(f"this connection already said hello (rank {rank})")
        token = msg.get("token")
        if not isinstance(token, str):
            raise ProtocolError("hello needs the job token (a string)")
        return Hello(_int_field(msg, "rank", 0, world_size - 1), token)
    if op == "ready":
        if rank is None:
            raise ProtocolError("say hello first")
        if "rank" in msg and (type(msg["rank"]) is not int or msg["rank"] != rank):
            raise ProtocolError(f"this connection is rank {rank}, not {show(msg['rank'])}")
        final = msg.get("final")
        if type(final) is not bool:
            raise ProtocolError(f"'final' must be true or false, got {show(final)}")
        return Ready(_int_field(msg, "steps", 0, MAX_STEPS), final)
    raise ProtocolError(f"unknown op {show(op)}")


def reply_line(delivery: Delivery) -> bytes:
    """The GG's answer line for ``delivery``."""
    if delivery.group is None:
        reply: dict[str, Any] = {"stop": True}
    else:
        g = delivery.group
        reply = {"group": list(g.members), "seq": g.seq, "round": g.round}
    return json.dumps(reply).encode() + b"\n"


def error_line(reason: str) -> bytes:
    return json.dumps({"error": reason}).encode() + b"\n"
