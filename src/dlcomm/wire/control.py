"""The switch's control channel: JSON objects, one per line, over TLS (docs/security.md).

Requests (worker or operator -> switch) and replies; ``token`` is the admin token, needed
when the switch listens beyond loopback:

    {"op": "register", "token": T, "addresses": [[ip, port], ...], "slots": W, "k": K,
     "name": "...", "multicast_port": P or null, "block": B, "auth": "authenticated"}
        -> {"ok": true, "job": J, "tickets": ["<hex>", ...], "slots": W, "k": K,
            "group": "239.x.y.z" or null, "auth": "..."}
    {"op": "challenge", "job": J, "rank": R, "ticket": "<hex>"}   -> {"ok": true}
        from rank R's registered IP: the switch sends a CHALLENGE datagram with a nonce to
        rank R's registered address (again, if asked again after 0.5 s: it was lost)
    {"op": "attach", "job": J, "rank": R, "ticket": "<hex>", "nonce": "<hex>"}
        -> {"ok": true, "secret": "<hex>", "live": bool, "auth": "..."}
        from rank R's registered IP, echoing the nonce its address received; once per
        rank. The job goes live when every rank has attached.
    {"op": "heartbeat"}                                  -> {"ok": true}  (attached only)
    {"op": "leave"}                                      -> {"ok": true}  (graceful end)
    {"op": "stats", "token": T}                          -> {"ok": true, "stats": {...}}
    {"op": "ping"}                                       -> {"ok": true, "version": "..."}
    any error                                            -> {"ok": false, "error": "..."}

Events (switch -> attached workers), unsolicited:

    {"event": "job_live", "job": J}                 every rank attached: packets flow
    {"event": "worker_left", "job": J, "rank": R[, "waiting": {"ranks": [...], "since_s": T}]}
                                                  a worker's connection closed before "leave"
                                                  (and whom the job was waiting for then)
    {"event": "job_failed", "job": J, "reason": "..."}   e.g. the workers' tensors differ
    {"event": "job_timeout", "job": J}              no packet and no heartbeat for too long

Lines are at most :data:`MAX_LINE` bytes; a line that is not a JSON object of plain values
(no NaN or Infinity, no absurd nesting) is refused with one error line.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["encode_line", "decode_line", "MAX_LINE", "BadRequest", "take_int", "take_str",
           "take_hex"]

MAX_LINE = 64 << 10


class BadRequest(ValueError):
    """A request the switch refuses (its message is the one-line error reply)."""


def _no_constants(name: str) -> Any:
    raise BadRequest(f"{name} is not a JSON value dlcomm accepts")


def encode_line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode_line(line: bytes) -> dict[str, Any]:
    """Parse one line; raise :class:`BadRequest` on anything but a JSON object of finite
    values."""
    if len(line) > MAX_LINE:
        raise BadRequest("control line too long")
    try:
        obj = json.loads(line, parse_constant=_no_constants)
    except RecursionError:
        raise BadRequest("control message nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"not JSON: {str(exc)[:80]}") from None
    if not isinstance(obj, dict):
        raise BadRequest("control message must be a JSON object")
    return obj


def take_int(req: dict[str, Any], key: str, lo: int, hi: int,
             default: int | None = None) -> int:
    """``req[key]`` as an integer in [lo, hi] (not a bool, not a float)."""
    value = req.get(key, default)
    if value is None and default is None and key not in req:
        raise BadRequest(f"{key} is missing")
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{key} must be an integer")
    if not lo <= value <= hi:
        raise BadRequest(f"{key} must be in {lo}..{hi}, got {value}")
    return value


def take_str(req: dict[str, Any], key: str, max_len: int, default: str | None = None) -> str:
    value = req.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    if len(value) > max_len:
        raise BadRequest(f"{key} is longer than {max_len} characters")
    return value


def take_hex(req: dict[str, Any], key: str, size: int) -> bytes:
    """``req[key]``: ``size`` bytes written as hex."""
    value = take_str(req, key, 2 * size)
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise BadRequest(f"{key} must be hex") from None
    if len(raw) != size:
        raise BadRequest(f"{key} must be {size} bytes")
    return raw
