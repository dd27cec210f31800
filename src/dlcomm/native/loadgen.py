"""The native load generator (csrc/loadgen.c): n workers of one job, from one thread."""

from __future__ import annotations

import ctypes as C

from dlcomm.native.lib import load, u8p, u64p
from dlcomm.native.switch import ip_int

__all__ = ["run_load", "LOAD_STATS"]

LOAD_STATS = ("rounds", "packets", "bytes", "results", "result_bytes", "resends",
              "send_errors", "send_calls")


def run_load(fds: list[int], switch: tuple[str, int], job: int, k: int, slots: int,
             auth: int, up_keys: bytes, seconds: float, gso: bool = True) -> dict[str, int]:
    """Keep ``slots`` slots of ``job`` busy from the sockets ``fds`` (one per rank) for
    ``seconds`` (the GIL is released); what was sent and received."""
    lib = load()
    func = lib.dlc_loadgen
    func.restype = C.c_int
    func.argtypes = [C.POINTER(C.c_int), C.c_int, C.c_uint32, C.c_uint16, C.c_uint16, C.c_int,
                     C.c_int, C.c_int, u8p, C.c_double, C.c_int, u64p]
    n = len(fds)
    keys = (C.c_uint8 * max(16, len(up_keys))).from_buffer_copy(up_keys.ljust(16 * n, b"\0"))
    stats = (C.c_uint64 * len(LOAD_STATS))()
    if func((C.c_int * n)(*fds), n, ip_int(switch[0]), switch[1], job, k, slots, auth, keys,
            seconds, int(gso), stats):
        raise ValueError(f"the load generator takes 1..64 workers (got {n})")
    return dict(zip(LOAD_STATS, stats))
