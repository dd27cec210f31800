"""``dlcomm bench auth``: what a tag costs per datagram, primitive and channel, per mode.

For a datagram of ``elements`` int32 values (the switch's default k: 62 KB), the median over
``repeats`` timings of ``count`` calls each of:

- the primitives: AES-128-GCM tag (GMAC, mode ``authenticated``) and its check, AES-128-GCM
  encryption (mode ``encrypted``), and for comparison HMAC-SHA256 and keyed BLAKE2b from the
  standard library;
- :class:`~dlcomm.wire.channel.Channel`: seal (a worker's DATA) and open (the switch's
  check, replay window included) in each mode, as the data path calls them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import click

from dlcomm.errors import ConfigError

__all__ = ["auth_cmd", "measure_auth"]


def _median_us(call: Callable[[], object], count: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(count):
            call()
        times.append((time.perf_counter() - start) / count)
    return statistics.median(times) * 1e6


def _channels(mode: str) -> tuple[Any, Any]:
    from dlcomm.wire.auth import AUTH_MODES, JobKeys
    from dlcomm.wire.channel import Channel

    secret = os.urandom(32)
    worker = Channel(JobKeys.derive(secret, 7, AUTH_MODES[mode], [0]), 0)
    switch = Channel(JobKeys.derive(secret, 7, AUTH_MODES[mode], range(1)), None)
    return worker, switch


def _channel_costs(mode: str, elements: int, payload: memoryview, count: int,
                   repeats: int) -> dict[str, float]:
    """A worker's seal of a DATA datagram and the switch's open of it, in ``mode``."""
    from dlcomm.wire.packet import DATA, Header, decode_header

    worker, switch = _channels(mode)
    header = Header(DATA, 7, 0, 0, elements, 0, 0, 0)
    sealed = b"".join(bytes(p) for p in worker.seal(header, payload))
    view = memoryview(sealed)
    hdr = decode_header(view)

    def check() -> None:
        switch.windows.clear()   # the same datagram each time: not a replay
        switch.open(hdr, view)

    return {"seal_us": _median_us(lambda: worker.seal(header, payload), count, repeats),
            "open_us": _median_us(check, count, repeats)}


def measure_auth(elements: int = 15872, count: int = 2000, repeats: int = 5
                 ) -> dict[str, Any]:
    """The ``bench-auth`` result (module docstring)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from dlcomm.results import new_result
    from dlcomm.wire.packet import HEADER_SIZE

    if elements < 1 or count < 1 or repeats < 1:
        raise ConfigError("--elements, --count and --repeats must be >= 1")
    payload = memoryview(bytearray(os.urandom(4 * elements)))
    whole = bytes(HEADER_SIZE) + bytes(payload)
    key, nonce = AESGCM(os.urandom(16)), os.urandom(12)
    tag = key.encrypt(nonce, b"", whole)
    mac_key = os.urandom(32)
    primitives = {
        "aes_gcm_tag": _median_us(lambda: key.encrypt(nonce, b"", whole), count, repeats),
        "aes_gcm_check": _median_us(lambda: key.decrypt(nonce, tag, whole), count, repeats),
        "aes_gcm_encrypt": _median_us(lambda: key.encrypt(nonce, payload, whole[:HEADER_SIZE]),
                                      count, repeats),
        "hmac_sha256": _median_us(lambda: hmac.digest(mac_key, whole, "sha256"), count,
                                  repeats),
        "blake2b_keyed": _median_us(lambda: hashlib.blake2b(whole, key=mac_key[:32],
                                                            digest_size=16).digest(),
                                    count, repeats)}
    channel = {mode: _channel_costs(mode, elements, payload, count, repeats)
               for mode in ("none", "authenticated", "encrypted")}
    result = new_result("bench-auth", {"elements": elements, "count": count,
                                       "repeats": repeats})
    result["summary"] = {"datagram_bytes": len(whole) + 16,
                         "primitives_us": {k: round(v, 2) for k, v in primitives.items()},
                         "channel_us": {m: {k: round(v, 2) for k, v in d.items()}
                                        for m, d in channel.items()}}
    return result


@click.command("auth")
@click.option("--elements", type=int, default=15872, show_default=True,
              help="int32 values per datagram (the switch's default k).")
@click.option("--count", type=int, default=2000, show_default=True,
              help="Calls per timing.")
@click.option("--repeats", type=int, default=5, show_default=True,
              help="Timings; the median is reported.")
@click.option("--json", "json_path", help="Write the JSON result here.")
def auth_cmd(elements: int, count: int, repeats: int, json_path: str | None) -> None:
    """Cost of tags per datagram: primitives and the packet channel, per mode."""
    from rich.console import Console
    from rich.table import Table

    from dlcomm.results import check_writable, write_json

    check_writable(json_path)
    result = measure_auth(elements, count, repeats)
    if json_path:
        write_json(json_path, result)
    s = result["summary"]
    table = Table("", "µs per datagram", title=f"tags on a {s['datagram_bytes']:,}-byte "
                  "datagram", title_justify="left")
    for name, value in s["primitives_us"].items():
        table.add_row(name, f"{value:.1f}")
    for mode, d in s["channel_us"].items():
        table.add_row(f"channel {mode}: seal / open", f"{d['seal_us']:.1f} / {d['open_us']:.1f}")
    if json_path:
        table.caption = f"JSON result: {json_path}"
    Console().print(table)
