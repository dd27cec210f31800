"""A bulk TCP transfer between two emulated hosts: the link self-test of ``cluster check``.

Run inside namespaces (``ip netns exec NS python -m dlcomm.emulate.bulk ...``):

- ``serve ADDR PORT``: accept one connection, count payload bytes after a warm-up, print
  a JSON line ``{"payload_bytes", "seconds"}``;
- ``send ADDR PORT SECONDS``: send as fast as the link allows; after a warm-up, read this
  host's ``eth0`` transmit counter at the start and the end of a SECONDS-long window and
  print ``{"wire_bytes", "seconds"}`` (bytes that actually left through the shaper).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

WARMUP_S = 0.5
CHUNK = 1 << 20


def tx_bytes(dev: str = "eth0") -> int:
    return int(Path(f"/sys/class/net/{dev}/statistics/tx_bytes").read_text())


def serve(addr: str, port: int) -> dict[str, float]:
    with socket.create_server((addr, port)) as srv:
        srv.settimeout(30)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(30)
            start = time.perf_counter()
            counted, t0 = 0, None
            while chunk := conn.recv(CHUNK):
                now = time.perf_counter()
                if t0 is None and now - start >= WARMUP_S:
                    t0 = now
                elif t0 is not None:
                    counted += len(chunk)
            t1 = time.perf_counter()
    return {"payload_bytes": counted, "seconds": t1 - (t0 or t1)}


def send(addr: str, port: int, seconds: float) -> dict[str, float]:
    deadline = time.monotonic() + 10
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    buf = b"\0" * CHUNK
    with conn:
        start = time.perf_counter()
        while time.perf_counter() - start < WARMUP_S:
            conn.sendall(buf)
        b0, t0 = tx_bytes(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            conn.sendall(buf)
        b1, t1 = tx_bytes(), time.perf_counter()
    return {"wire_bytes": b1 - b0, "seconds": t1 - t0}


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 3:
        print(json.dumps(serve(argv[1], int(argv[2]))), flush=True)
    elif argv[:1] == ["send"] and len(argv) == 4:
        print(json.dumps(send(argv[1], int(argv[2]), float(argv[3]))), flush=True)
    else:
        print("usage: bulk serve ADDR PORT | bulk send ADDR PORT SECONDS", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from dlcomm.runtime.processes import die_with_parent

    die_with_parent()
    raise SystemExit(main(sys.argv[1:]))
