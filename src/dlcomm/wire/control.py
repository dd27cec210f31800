"""The switch's control channel: JSON objects, one per line, over TCP.

Requests (worker -> switch) and replies:

    {"op": "register", "addresses": [[ip, port], ...], "slots": W, "k": K, "name": "...",
     "multicast_port": P or null, "block": B (0: dense only; else sparse rounds too)}
        -> {"ok": true, "job": J, "key": "<16 hex digits>", "slots": W, "k": K,
            "group": "239.77.x.y" or null}  (with a group, results go to group:P)
        (sent by rank 0; its connection is then attached as rank 0)
    {"op": "attach", "job": J, "key": "...", "rank": R}   -> {"ok": true}
    {"op": "leave"}                                      -> {"ok": true}   (graceful end)
    {"op": "stats"}                                      -> {"ok": true, "stats": {...}}
    {"op": "ping"}                                       -> {"ok": true, "version": "..."}
    any error                                            -> {"ok": false, "error": "..."}

Events (switch -> attached workers), unsolicited:

    {"event": "worker_left", "job": J, "rank": R}   a worker's connection closed before "leave"
    {"event": "job_timeout", "job": J}              no packet for the job's idle timeout

A job ends when all its workers have left; a worker whose connection drops without leaving
has died, and the switch tells the others at once.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["encode_line", "decode_line", "MAX_LINE"]

MAX_LINE = 1 << 20


def encode_line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def decode_line(line: bytes) -> dict[str, Any]:
    """Parse one line; raise ValueError on anything that is not a JSON object."""
    if len(line) > MAX_LINE:
        raise ValueError("control line too long")
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("control message must be a JSON object")
    return obj
