"""Control lines an attacker would send a switch: malformed, hostile, plausible (pure).

:class:`ControlMutator` makes one line at a time (bytes ending in a newline) from one seeded
generator. Kinds, each aimed at a check of the control plane (docs/security.md):

- ``valid``: ping and stats (answered normally);
- ``junk``: random bytes, not UTF-8 or not JSON;
- ``shape``: JSON that is not an object, or an object without a known op;
- ``nested``: arrays or objects nested thousands deep (a recursive parser's limit);
- ``numbers``: ``Infinity``, ``NaN``, ``1e400``, integers of thousands of digits, booleans
  where integers belong;
- ``register``: registrations with hostile addresses (multicast, broadcast, hostnames, NUL
  characters, ports 0 and 70000, too many workers) or fields out of range, and now and
  then a valid one (rate-limited per source);
- ``guess``: attach, challenge, heartbeat and leave for guessed jobs, tickets and nonces;
- ``long``: a line over the 64 KiB limit (the switch answers once and closes).

A reply is expected to every line but a ``long`` one's, after which the connection is gone.
"""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ["ControlMutator", "CONTROL_KINDS"]

CONTROL_KINDS = ("valid", "junk", "shape", "nested", "numbers", "register", "guess", "long")
_WEIGHTS = (2, 2, 2, 1, 2, 3, 3, 0.02)
_HOSTILE_HOSTS = ("224.0.0.1", "239.1.2.3", "255.255.255.255", "0.0.0.0", "localhost",
                  "a\u0000b", "::1", "127.0.0.1\n", "300.1.1.1", "", "240.0.0.1")
_NUMBERS = (b"Infinity", b"-Infinity", b"NaN", b"1e400", b"-1e400", b"true", b"null",
            b"1.5", b"-1", b"4294967296", b"9" * 5000)


class ControlMutator:
    """Attack control lines (module docstring); ``line_limit`` is the switch's line cap."""

    def __init__(self, seed: int, line_limit: int = 64 * 1024) -> None:
        self.rng = random.Random(seed)
        self.line_limit = line_limit
        self.made: dict[str, int] = dict.fromkeys(CONTROL_KINDS, 0)

    def next(self) -> tuple[bytes, str]:
        """One line (newline included) and its kind."""
        kind = self.rng.choices(CONTROL_KINDS, _WEIGHTS)[0]
        self.made[kind] += 1
        line = getattr(self, f"_{kind}")()
        return line.replace(b"\n", b" ") + b"\n", kind

    # -- kinds -----------------------------------------------------------------------------
    def _valid(self) -> bytes:
        return _dump({"op": self.rng.choice(("ping", "stats")), "id": self.rng.randrange(99)})

    def _junk(self) -> bytes:
        rng = self.rng
        if rng.random() < 0.5:
            return rng.randbytes(rng.randrange(1, 200))
        return bytes(rng.choice(b'{}[]":,0123456789abcdefnulrt\\ ') for _ in range(
            rng.randrange(1, 120)))

    def _shape(self) -> bytes:
        rng = self.rng
        return rng.choice((b"[1, 2, 3]", b'"op"', b"42", b"{}", b'{"op": 7}',
                           b'{"op": null}', b'{"op": "shutdown"}', b'{"op": ["ping"]}',
                           _dump({"op": "x" * rng.randrange(1, 500)}),
                           b'{"op": "ping", "op": "stats"}', b"\xef\xbb\xbf{}"))

    def _nested(self) -> bytes:
        depth = self.rng.choice((100, 1000, 5000, 20000))
        if self.rng.random() < 0.5:
            return b"[" * depth + b"]" * depth
        depth = min(depth, 5000)   # 6 bytes a level: deeper objects exceed the line limit
        return b'{"a":' * depth + b"1" + b"}" * depth

    def _numbers(self) -> bytes:
        rng = self.rng
        key = rng.choice((b"slots", b"k", b"job", b"rank", b"block", b"multicast_port"))
        op = rng.choice((b"register", b"attach", b"challenge"))
        return b'{"op": "' + op + b'", "' + key + b'": ' + rng.choice(_NUMBERS) + b"}"

    def _address(self) -> Any:
        rng = self.rng
        roll = rng.random()
        if roll < 0.4:
            return [rng.choice(_HOSTILE_HOSTS), rng.randrange(1, 65536)]
        if roll < 0.7:
            return ["127.0.0.1", rng.choice((0, -1, 65536, 70000, 2 ** 40, "80", 1.5, True))]
        if roll < 0.8:
            return ["127.0.0.1"]
        return ["127.0.0.1", rng.randrange(1, 65536)]

    def _register(self) -> bytes:
        rng = self.rng
        workers = rng.choice((1, 2, 4, 2000))
        req: dict[str, Any] = {
            "op": "register", "addresses": [self._address() for _ in range(min(workers, 4))]
            * (1 if workers <= 4 else 500),
            "slots": rng.choice((1, 2, 0, -3, 10 ** 6)), "k": rng.choice((16, 0, 10 ** 9)),
            "block": rng.choice((0, 0, 16, -1, 1 << 20)),
            "auth": rng.choice(("authenticated", "encrypted", "none", "bogus", 3)),
            "name": rng.choice(("fuzz", "x" * 200, 5))}
        if rng.random() < 0.1:  # a valid one, now and then: small, abandoned at once
            req = {"op": "register", "addresses": [["127.0.0.1", rng.randrange(1024, 65536)]],
                   "slots": 1, "k": 16, "name": "fuzz"}
        if rng.random() < 0.2:
            req["multicast_port"] = rng.choice((5000, 0, 70000, "x"))
        return _dump(req)

    def _guess(self) -> bytes:
        rng = self.rng
        op = rng.choice(("attach", "challenge", "heartbeat", "leave", "attach"))
        req: dict[str, Any] = {"op": op, "job": rng.choice((rng.randrange(0xFFFF), -1, "1")),
                               "rank": rng.choice((0, 1, 3, 1 << 20, -1)),
                               "ticket": rng.choice((rng.randbytes(16).hex(), "zz", "", 16)),
                               "nonce": rng.choice((rng.randbytes(16).hex(), "00" * 15))}
        for key in rng.sample(("job", "rank", "ticket", "nonce"), rng.randrange(3)):
            del req[key]
        return _dump(req)

    def _long(self) -> bytes:
        return b'{"op": "ping", "pad": "' + b"x" * (self.line_limit + 1024) + b'"}'


def _dump(obj: Any) -> bytes:
    return json.dumps(obj).encode()
