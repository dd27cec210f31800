"""Seed inputs for the native harness's socket target (csrc/harness/fuzz_socket.c): the
switch's answers to a worker, as :mod:`dlcomm.testing.native_corpus` writes them for the
socket-free target, sent through loopback sockets instead.

An input is one configuration byte (:data:`CONFIGS`), then records ``u8 selector, u16
little-endian length, bytes``. The selector: :data:`SEAL` (the harness seals each datagram
as the switch would), :data:`STRANGER` (sent from a socket that is not the switch's),
:data:`RESULTS` (to the worker's results socket, where the configuration gives it one),
:data:`RUN` (the worker's loop runs a slice after it), and in the low four bits how many
datagrams the bytes are: 0 none (a slice of time passes), 1 one, 2-15 that many equal
pieces (the last shorter) sent as one UDP_SEGMENT batch, which the worker receives whole
(UDP_GRO) and must cut back.

The stories are native_corpus's: results that complete the worker's ops, statuses, replays,
forgeries, errors, silence until it gives up, odd datagrams; runs of same-size datagrams
go out as one batch. Every configuration replays every story: the harness seals with the
configuration's mode, so one plaintext story serves MAC and encrypted jobs alike.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

from dlcomm.testing.native_corpus import A_SWITCH, CLIENT, SOURCES, record
from dlcomm.wire.packet import HEADER_SIZE, RESULT

__all__ = ["write_socket_corpus", "socket_records", "CONFIGS", "SEAL", "STRANGER", "RESULTS",
           "RUN", "ENCRYPT", "RESULTS_SOCKET", "MANY_SLOTS", "NO_OFFLOAD"]

SEAL, STRANGER, RESULTS, RUN = 0x80, 0x40, 0x20, 0x10
ENCRYPT, RESULTS_SOCKET, MANY_SLOTS, NO_OFFLOAD = 0x01, 0x02, 0x04, 0x08
MAX_BATCH = 15
CONFIGS = {"mac": 0, "encrypted": ENCRYPT, "results-socket": RESULTS_SOCKET,
           "many-slots": MANY_SLOTS, "no-offload": NO_OFFLOAD,
           "encrypted-results-many": ENCRYPT | RESULTS_SOCKET | MANY_SLOTS}
STORIES = ("client", "odd")   # native_corpus's sources with records to the worker


def _parse(data: bytes) -> list[tuple[int, bytes]]:
    out, at = [], 0
    while at + 3 <= len(data):
        selector, n = struct.unpack_from("<BH", data, at)
        out.append((selector, data[at + 3: at + 3 + n]))
        at += 3 + n
    return out


def socket_records(records: list[bytes], rng: random.Random) -> list[bytes]:
    """native_corpus records as fuzz_socket.c's: those to the worker sent from the switch's
    socket (or a stranger's), each other record a slice of silence; consecutive datagrams of
    one size and one sender joined into one batch (up to :data:`MAX_BATCH`)."""
    plain: list[tuple[int, bytes]] = []
    for selector, body in _parse(b"".join(records)):
        if not selector & CLIENT:
            plain.append((RUN, b""))            # to the switch: the worker hears nothing
            continue
        sel = (selector & SEAL) | (0 if selector & 0x3F == A_SWITCH else STRANGER)
        if len(body) > 3 and body[3] == RESULT and rng.random() < 0.5:
            sel |= RESULTS
        plain.append((sel, body))
    out: list[bytes] = []
    i = 0
    while i < len(plain):
        sel, body = plain[i]
        j = i + 1
        if body and len(body) >= HEADER_SIZE:
            while (j < len(plain) and j - i < MAX_BATCH and plain[j][0] == sel
                   and len(plain[j][1]) == len(body)):
                j += 1
        count = 0 if not body and sel == RUN else j - i
        out.append(record(sel | RUN | count, b"".join(b for _, b in plain[i:j])))
        i = j
    return out


def write_socket_corpus(directory: str | Path, count: int, seed: int) -> list[Path]:
    """About ``count`` records per story (:data:`STORIES`), one file per story and
    configuration, into ``directory``; returns the files. The same seed writes the same
    bytes."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for story in STORIES:
        records = SOURCES[story](random.Random(rng.getrandbits(64)), count)
        body = b"".join(socket_records(records, random.Random(rng.getrandbits(64))))
        for name, config in CONFIGS.items():
            path = root / f"{story}-{name}"
            path.write_bytes(bytes([config]) + body)
            paths.append(path)
    return paths
