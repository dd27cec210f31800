"""Seed inputs for the native harness's socket target (csrc/harness/fuzz_socket.c): the
switch's answers to a worker, as :mod:`dlcomm.testing.native_corpus` writes them for the
socket-free target, sent through loopback sockets instead.

An input is one configuration byte (:data:`CONFIGS`), then records ``u8 selector, u16
little-endian length, bytes``. The selector: :data:`SEAL` (the harness seals each datagram
as the switch would), :data:`STRANGER` (sent from a socket that is not the switch's),
:data:`RESULTS` (to the worker's results socket, where the configuration gives it one),
:data:`RUN` (the worker's loop runs a slice after it), and in the low four bits how many
datagrams the bytes are: 0 none (a slice of time passes, which the worker's loop runs
with :data:`RUN`, or not without it), 1 one, 2-15 pieces of
ceil(n / count) bytes (the last shorter) sent as one UDP_SEGMENT batch, which the worker
receives whole (UDP_GRO) and must cut back.

The stories are native_corpus's (results that complete the worker's dense ops, statuses,
replays, forgeries, errors, silence until it gives up, odd datagrams) and, for a worker in
sparse rounds (:data:`SPARSE`), what the Python switch sends rank 0 while three Python
workers sum sparse tensors (:func:`sparse_story`): announce answers, plans, results. Runs
of same-size datagrams go out as one batch. The harness seals with the configuration's
mode, so one plaintext story serves MAC and encrypted jobs alike.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np

from dlcomm.exchange.switch.sparse_window import SparseAllreduceOp
from dlcomm.exchange.switch.window import Timing
from dlcomm.testing.fakenet import FakeNet, NetConfig, _switches
from dlcomm.testing.native_corpus import A_SWITCH, CLIENT, J_MAC, SOURCES, K, record
from dlcomm.testing.native_corpus import SEAL as NATIVE_SEAL
from dlcomm.wire.auth import AUTH_NONE
from dlcomm.wire.packet import HEADER_SIZE, RESULT, decode_header

__all__ = ["write_socket_corpus", "socket_records", "sparse_story", "sparse_data", "CONFIGS",
           "STORIES", "SEAL", "STRANGER", "RESULTS", "RUN", "ENCRYPT", "RESULTS_SOCKET",
           "MANY_SLOTS", "NO_OFFLOAD", "SPARSE"]

SEAL, STRANGER, RESULTS, RUN = 0x80, 0x40, 0x20, 0x10
ENCRYPT, RESULTS_SOCKET, MANY_SLOTS, NO_OFFLOAD, SPARSE = 0x01, 0x02, 0x04, 0x08, 0x10
MAX_BATCH = 15
SLOTS_FEW, WORKERS = 2, 3                       # fuzz_socket.c's worker: rank 0 of 3
SPARSE_BLOCK, SPARSE_ELEMENTS = 4, 160          # its sparse op (fuzz_socket.c)
CONFIGS = {"mac": 0, "encrypted": ENCRYPT, "results-socket": RESULTS_SOCKET,
           "many-slots": MANY_SLOTS, "no-offload": NO_OFFLOAD,
           "encrypted-results-many": ENCRYPT | RESULTS_SOCKET | MANY_SLOTS,
           "sparse": SPARSE, "sparse-encrypted-results": SPARSE | ENCRYPT | RESULTS_SOCKET}


def socket_records(records: list[bytes], rng: random.Random) -> list[bytes]:
    """native_corpus records as fuzz_socket.c's: those to the worker sent from the switch's
    socket (or a stranger's), each other record a slice of silence; consecutive datagrams of
    one size and one sender joined into one batch (up to :data:`MAX_BATCH`)."""
    plain: list[tuple[int, bytes]] = []
    for rec in records:   # each one record (native_corpus.record)
        selector, body = rec[0], rec[3:]
        if not selector & CLIENT:
            plain.append((RUN, b""))            # to the switch: the worker hears nothing
            continue
        sel = (SEAL if selector & NATIVE_SEAL else 0) | \
            (0 if selector & 0x3F == A_SWITCH else STRANGER)
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


def sparse_data(rank: int, seed: int = 0) -> np.ndarray:
    """A worker's tensor for the sparse story. Rank 0's is fuzz_socket.c's, element for
    element: (i % 7 - 3) / 4 in every third block of :data:`SPARSE_BLOCK`, else 0. The
    others: a random half of the blocks present."""
    i = np.arange(SPARSE_ELEMENTS)
    if rank == 0:
        return np.where((i // SPARSE_BLOCK) % 3 == 0, (i % 7 - 3) * 0.25, 0).astype(np.float32)
    rng = np.random.default_rng(seed * 7 + rank)
    present = np.repeat(rng.random(SPARSE_ELEMENTS // SPARSE_BLOCK) < 0.5, SPARSE_BLOCK)
    return np.where(present, rng.normal(size=SPARSE_ELEMENTS), 0).astype(np.float32)


def sparse_story(rng: random.Random, n: int) -> list[bytes]:
    """What the Python switch sends rank 0 while three Python workers (sparse_window.py)
    sum :func:`sparse_data` in sparse rounds, on a fake net without loss: op after op (the
    others' tensors change), until ``n`` records. Each datagram's job becomes the harness's
    and its counter the next of its stream (the harness seals with it as the nonce)."""
    out: list[bytes] = []
    counters = {True: 0, False: 0}   # the result stream's, the down stream's
    fnet = FakeNet(NetConfig(seed=rng.getrandbits(30)))
    workers = [(f"10.0.0.{r + 1}", 7000) for r in range(WORKERS)]
    switch, dataplanes, views = _switches(fnet, workers, 1, SLOTS_FEW, K, False, SPARSE_BLOCK,
                                          AUTH_NONE)
    seqs = [[[0] * SLOTS_FEW] for _ in workers]   # each worker's, from op to op

    def send(src: tuple[str, int], sends: list) -> None:
        for dst, parts in sends:
            fnet.send(src, dst, b"".join(bytes(p) for p in parts))

    while len(out) < n:
        seed = rng.getrandbits(30)
        data = [sparse_data(r, seed) for r in range(WORKERS)]
        ops = [SparseAllreduceOp(x, x, r, WORKERS, K, views[r], seqs[r], Timing(),
                                 block=SPARSE_BLOCK) for r, x in enumerate(data)]
        for r, op in enumerate(ops):
            send(workers[r], op.start(fnet.now))
        while not all(op.done for op in ops):
            deadline = min(op.next_deadline() for op in ops if not op.done)
            if deadline < fnet.next_time():   # (no loss: only a slow answer times out)
                fnet.now = max(fnet.now, deadline)
                for r, op in enumerate(ops):
                    if not op.done and op.next_deadline() <= fnet.now:
                        send(workers[r], op.on_timeout(fnet.now))
                continue
            ev = fnet.pop()
            if ev.dst == switch[0]:
                send(ev.dst, dataplanes[0].on_datagram(ev.data, ev.src, fnet.now))
                continue
            r = workers.index(ev.dst)
            if r == 0:
                header = decode_header(ev.data)
                result = header.type == RESULT
                renamed = dataclasses.replace(header, job=J_MAC)
                out.append(record(CLIENT | NATIVE_SEAL | A_SWITCH,
                                  renamed.pack(counters[result]) + ev.data[HEADER_SIZE:]))
                counters[result] += 1
            send(workers[r], ops[r].on_datagram(ev.data, ev.src, fnet.now))
    return out[:n]


# the stories, and the configurations that replay each (those of their worker's op)
STORIES = {"client": [c for c in CONFIGS if not CONFIGS[c] & SPARSE],
           "odd": list(CONFIGS),
           "sparse": [c for c in CONFIGS if CONFIGS[c] & SPARSE]}


def write_socket_corpus(directory: str | Path, count: int, seed: int) -> list[Path]:
    """About ``count`` records per story (:data:`STORIES`), one file per story and
    configuration, into ``directory``; returns the files. The same seed writes the same
    bytes."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for story, configs in STORIES.items():
        make = sparse_story if story == "sparse" else SOURCES[story]
        records = make(random.Random(rng.getrandbits(64)), count)
        body = b"".join(socket_records(records, random.Random(rng.getrandbits(64))))
        for name in configs:
            path = root / f"{story}-{name}"
            path.write_bytes(bytes([CONFIGS[name]]) + body)
            paths.append(path)
    return paths
