"""The worker's native transport (csrc/client.c): dense all-reduces and sparse rounds.

:class:`Client` holds what persists across ops on one UDP socket: the shards (switch
addresses, job numbers, keys), the slots' sequence numbers, the packet counters and replay
windows, and the round-trip estimate. :meth:`Client.begin` starts summing a float32 array
in place; :meth:`Client.run` drives it for a slice of time with the GIL released and says
whether it finished. Between slices the caller looks at its control channel (a dead peer).
The pure calls (:meth:`Client.on_datagram`, :meth:`Client.on_timeout`, :meth:`Client.take`)
drive the same state machine without sockets, for the differential tests.
"""

from __future__ import annotations

import ctypes as C
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dlcomm.native.lib import load, offload, u8p, u64p
from dlcomm.native.switch import ip_int, outputs_of

__all__ = ["Client", "ShardKeys", "ClientError", "WINDOW_BYTES", "MAX_SHARDS", "E_PLAN",
           "E_SOCKET"]

WINDOW_BYTES = 4096 // 8
MAX_SHARDS = 16
E_NONE, E_SWITCH, E_NONFINITE, E_STUCK, E_NO_ANSWER, E_PLAN, E_SOCKET = range(7)
_STATS = ("packets_sent", "bytes_sent", "packets_received", "bytes_received",
          "retransmissions", "probes", "rejected", "drops_injected")
_OUT_CAP = 1 << 22

_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "dlc_client_new": (C.c_void_p, [C.c_int, C.c_int, C.c_int, C.c_int, C.c_int, C.c_double,
                                    C.c_double, C.c_double, C.c_double, C.c_double,
                                    C.c_uint64]),
    "dlc_client_free": (None, [C.c_void_p]),
    "dlc_client_shard": (C.c_int, [C.c_void_p, C.c_uint32, C.c_uint16, C.c_uint16, C.c_int,
                                   u8p]),
    "dlc_client_begin": (C.c_int, [C.c_void_p, C.c_void_p, C.c_void_p, C.c_size_t,
                                   C.c_double]),
    "dlc_client_allow_skew": (None, [C.c_void_p, C.c_double]),
    "dlc_client_set_gso": (None, [C.c_void_p, C.c_int]),
    "dlc_client_set_results_fd": (None, [C.c_void_p, C.c_int]),
    "dlc_client_done": (C.c_int, [C.c_void_p]),
    "dlc_client_next_deadline": (C.c_double, [C.c_void_p]),
    "dlc_client_on_datagram": (None, [C.c_void_p, C.c_void_p, C.c_size_t, C.c_uint32,
                                      C.c_uint16, C.c_double]),
    "dlc_client_on_timeout": (None, [C.c_void_p, C.c_double]),
    "dlc_client_error": (C.c_int, [C.c_void_p, C.c_char_p, C.c_size_t, C.POINTER(C.c_long),
                                   C.POINTER(C.c_int), u64p, C.POINTER(C.c_int), u64p,
                                   C.POINTER(C.c_double), C.c_double]),
    "dlc_client_take": (C.c_long, [C.c_void_p, C.c_void_p, C.c_size_t]),
    "dlc_client_state_get": (None, [C.c_void_p, C.c_int, u64p, u64p, C.POINTER(C.c_int),
                                    u8p, u64p, C.POINTER(C.c_int), u8p, u64p]),
    "dlc_client_state_set": (None, [C.c_void_p, C.c_int, C.c_uint64, C.c_uint64, C.c_int,
                                    u8p, C.c_uint64, C.c_int, u8p, u64p]),
    "dlc_client_stats": (None, [C.c_void_p, u64p]),
    "dlc_client_run": (C.c_int, [C.c_void_p, C.c_double]),
    "dlc_client_begin_sparse": (C.c_int, [C.c_void_p, C.c_void_p, C.c_void_p, C.c_size_t,
                                          C.c_int, C.c_void_p, C.c_void_p, C.c_double]),
    "dlc_client_union_blocks": (C.c_long, [C.c_void_p]),
    "dlc_client_count_blocks": (C.c_int, [C.c_void_p, C.c_int]),
}


@lru_cache(maxsize=1)
def _lib() -> C.CDLL:
    lib = load()
    for name, (restype, argtypes) in _SIGNATURES.items():
        func = getattr(lib, name)
        func.restype, func.argtypes = restype, argtypes
    return lib


@dataclass(frozen=True)
class ShardKeys:
    """One switch shard as the native client needs it."""

    address: tuple[str, int]
    job: int
    slots: int
    keys: bytes          # up, down, result: 48 bytes (empty in mode none)


@dataclass(frozen=True)
class ClientError:
    """Why an op failed, in the terms window.py formats (exchange/switch/window.py)."""

    kind: int            # E_SWITCH, E_NONFINITE, E_STUCK, E_NO_ANSWER, E_PLAN, E_SOCKET
    shard: int
    text: bytes          # E_SWITCH: the ERROR's payload; E_PLAN: what was wrong
    element: int         # E_NONFINITE: this worker's first non-finite element (-1: none);
                         # E_SOCKET: the errno of the send (or EBADF: a socket closed)
    missing: list[int]   # E_STUCK: the ranks the switch waits for
    slot: int
    seq: int
    idle_s: float


@dataclass
class WindowState:
    """A replay window in the Python convention (wire/auth.ReplayWindow)."""

    highest: int
    bits: int


class Client:
    def __init__(self, fd: int, rank: int, workers: int, k: int, auth: int,
                 shards: list[ShardKeys], initial_timeout_s: float, min_timeout_s: float,
                 max_timeout_s: float, deadline_s: float, drop_rate: float = 0.0,
                 seed: int = 0, results_fd: int = -1) -> None:
        self.lib = _lib()
        handle = self.lib.dlc_client_new(fd, rank, workers, k, auth, initial_timeout_s,
                                         min_timeout_s, max_timeout_s, deadline_s, drop_rate,
                                         seed)
        if not handle:
            raise ValueError(f"the native client takes 1..64 workers and k up to the "
                             f"datagram (rank {rank} of {workers}, k {k})")
        self.handle: int = handle
        self.shards = shards
        for sh in shards:
            keys = (C.c_uint8 * 48).from_buffer_copy(sh.keys.ljust(48, b"\0")[:48])
            if self.lib.dlc_client_shard(self.handle, ip_int(sh.address[0]), sh.address[1],
                                         sh.job, sh.slots, keys) < 0:
                self.close()
                raise ValueError(f"at most {MAX_SHARDS} shards")
        self.lib.dlc_client_set_gso(self.handle, int(offload()))
        self.lib.dlc_client_set_results_fd(self.handle, results_fd)  # -1: none
        self._arrays: tuple[np.ndarray, ...] | None = None
        self._out = C.create_string_buffer(_OUT_CAP)

    def close(self) -> None:
        if self.handle:
            self.lib.dlc_client_free(self.handle)
            self.handle = 0

    # -- state shared with the Python ops --------------------------------------------
    def set_state(self, shard: int, up_next: int, result: WindowState, down: WindowState,
                  seqs: list[int]) -> None:
        def bits(w: WindowState) -> C.Array[C.c_uint8]:
            return (C.c_uint8 * WINDOW_BYTES).from_buffer_copy(
                w.bits.to_bytes(WINDOW_BYTES, "little"))
        arr = (C.c_uint64 * len(seqs))(*seqs)
        self.lib.dlc_client_state_set(self.handle, shard, up_next, max(result.highest, 0),
                                      int(result.highest >= 0), bits(result),
                                      max(down.highest, 0), int(down.highest >= 0),
                                      bits(down), arr)

    def get_state(self, shard: int) -> tuple[int, WindowState, WindowState, list[int]]:
        up, rh, dh = C.c_uint64(), C.c_uint64(), C.c_uint64()
        ra, da = C.c_int(), C.c_int()
        rbits, dbits = (C.c_uint8 * WINDOW_BYTES)(), (C.c_uint8 * WINDOW_BYTES)()
        seqs = (C.c_uint64 * self.shards[shard].slots)()
        self.lib.dlc_client_state_get(self.handle, shard, C.byref(up), C.byref(rh),
                                      C.byref(ra), rbits, C.byref(dh), C.byref(da), dbits,
                                      seqs)

        def window(h: C.c_uint64, a: C.c_int, b: C.Array[C.c_uint8]) -> WindowState:
            return WindowState(h.value if a.value else -1,
                               int.from_bytes(bytes(b), "little") if a.value else 0)
        return up.value, window(rh, ra, rbits), window(dh, da, dbits), list(seqs)

    # -- an op ------------------------------------------------------------------------
    def begin(self, data: np.ndarray, now: float) -> None:
        """Start summing the float32 ``data`` in place (kept alive until the next begin)."""
        if data.dtype != np.float32 or not data.flags.c_contiguous:
            raise ValueError("the native client sums contiguous float32 arrays")
        self._arrays = (data, data)
        if self.lib.dlc_client_begin(self.handle, data.ctypes.data, data.ctypes.data,
                                     len(data), now):
            raise MemoryError("cannot allocate the op's packets")

    def begin_sparse(self, data: np.ndarray, block: int, now: float,
                     present: np.ndarray | None = None,
                     negative_zero: np.ndarray | None = None) -> None:
        """Start summing ``data`` in place in sparse rounds (sparse_window.py) of blocks of
        ``block`` (threshold 0); ``present``/``negative_zero``: the tensor's
        wire/sparse.present_blocks, if the caller has them (else this scans the data)."""
        if data.dtype != np.float32 or not data.flags.c_contiguous:
            raise ValueError("the native client sums contiguous float32 arrays")
        known = present is not None and negative_zero is not None
        flags = (np.ascontiguousarray(present, bool), np.ascontiguousarray(negative_zero, bool)) \
            if known else None
        self._arrays = (data, data) if flags is None else (data, *flags)
        rc = self.lib.dlc_client_begin_sparse(
            self.handle, data.ctypes.data, data.ctypes.data, len(data), block,
            flags[0].ctypes.data if flags else None, flags[1].ctypes.data if flags else None,
            now)
        if rc == -2:
            raise ValueError(f"sparse block {block} must divide k")
        if rc:
            raise MemoryError("cannot allocate the op's packets")

    def count_blocks(self, block: int) -> None:
        """Dense ops from now on count the blocks of ``block`` elements of their result that
        hold data (:meth:`union_blocks`), as each packet comes in; 0: they do not."""
        if self.lib.dlc_client_count_blocks(self.handle, block):
            raise ValueError(f"block {block} must divide k")

    def union_blocks(self) -> int:
        """Blocks of the last op's result that came back non-zero (the global density): a
        sparse op's, or a dense op's that counts them (:meth:`count_blocks`)."""
        return int(self.lib.dlc_client_union_blocks(self.handle))

    def allow_skew(self, seconds: float) -> None:
        self.lib.dlc_client_allow_skew(self.handle, seconds)

    def run(self, slice_s: float) -> int:
        """1: done, 0: not yet, -1: failed (:meth:`error`; a socket's error too)."""
        return int(self.lib.dlc_client_run(self.handle, slice_s))

    def done(self) -> int:
        return int(self.lib.dlc_client_done(self.handle))

    def error(self, now: float) -> ClientError | None:
        text = C.create_string_buffer(512)
        arg, shard, slot = C.c_long(), C.c_int(), C.c_int()
        missing, seq, idle = C.c_uint64(), C.c_uint64(), C.c_double()
        kind = self.lib.dlc_client_error(self.handle, text, 512, C.byref(arg), C.byref(shard),
                                         C.byref(missing), C.byref(slot), C.byref(seq),
                                         C.byref(idle), now)
        if kind == E_NONE:
            return None
        ranks = [r for r in range(64) if missing.value >> r & 1]
        return ClientError(kind, shard.value,
                           text.raw[: arg.value if kind in (E_SWITCH, E_PLAN) else 0],
                           arg.value, ranks, slot.value, seq.value, idle.value)

    def stats(self) -> dict[str, int]:
        out = (C.c_uint64 * len(_STATS))()
        self.lib.dlc_client_stats(self.handle, out)
        return dict(zip(_STATS, out))

    # -- the pure calls (tests) ----------------------------------------------------------
    def on_datagram(self, data: bytes, src: tuple[str, int], now: float) -> None:
        buf = C.create_string_buffer(bytes(data), max(1, len(data)))
        self.lib.dlc_client_on_datagram(self.handle, buf, len(data), ip_int(src[0]), src[1],
                                        now)

    def on_timeout(self, now: float) -> None:
        self.lib.dlc_client_on_timeout(self.handle, now)

    def next_deadline(self) -> float:
        return float(self.lib.dlc_client_next_deadline(self.handle))

    def take(self) -> list[tuple[tuple[str, int], bytes]]:
        """What the op would have sent since the last take."""
        n = self.lib.dlc_client_take(self.handle, self._out, _OUT_CAP)
        return outputs_of(self._out.raw, n)
