"""The switch's outputs onto its UDP socket, each send in its own exception boundary (both
the Python packet loop and the native loop's slow path send through here)."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable
from random import Random

from dlcomm.wire.channel import Parts

__all__ = ["send_outputs"]


def send_outputs(sock: socket.socket, outputs: list[tuple[tuple[str, int], Parts]],
                 drop_rate: float, rng: Random, counters: Counter[str],
                 count: Callable[[str, str], None]) -> None:
    """Send every output (dropping each with ``drop_rate``); a failed send is counted and
    logged once by ``count``, never raised."""
    for addr, parts in outputs:
        if drop_rate and rng.random() < drop_rate:
            counters["drop_injected_out"] += 1
            continue
        try:
            sent = sock.sendmsg(parts, [], 0, addr)
        except OSError as exc:
            count("send_errors", f"sending to {addr} failed: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 (no output may end the loop)
            count("send_failures", f"sending to {addr!r} raised {exc!r}")
            continue
        counters["packets_out"] += 1
        counters["bytes_out"] += sent
