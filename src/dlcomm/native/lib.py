"""The compiled library (``_dlc*.so``, built from csrc/ by setup.py) and its signatures.

ctypes.CDLL releases the GIL around every foreign call, so a call that blocks (the packet
loop, a slow-path wait, an all-reduce) lets the other Python threads run.
"""

from __future__ import annotations

import ctypes as C
import importlib.machinery
import os
from functools import lru_cache
from pathlib import Path

from dlcomm.errors import ConfigError

__all__ = ["NativeMissing", "available", "load", "counter_names", "library_path", "offload",
           "GSO_ENV"]

GSO_ENV = "DLCOMM_GSO"   # "off": one datagram per system call entry, no UDP_SEGMENT/UDP_GRO

HERE = Path(__file__).resolve().parent
u8p, u16p, u32p, u64p = (C.POINTER(t) for t in (C.c_uint8, C.c_uint16, C.c_uint32, C.c_uint64))


class NativeMissing(ConfigError):
    """The native data path was not built (or cannot be loaded)."""


def library_path() -> Path | None:
    """The built library: ``DLCOMM_NATIVE_LIB`` if set (a sanitizer build), else the
    extension next to this file."""
    override = os.environ.get("DLCOMM_NATIVE_LIB")
    if override:
        return Path(override)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = HERE / f"_dlc{suffix}"
        if path.exists():
            return path
    return None


_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "dlc_counter_names": (C.c_char_p, []),
    "dlc_counter_count": (C.c_int, []),
    "dlc_switch_new": (C.c_void_p, []),
    "dlc_switch_free": (None, [C.c_void_p]),
    "dlc_job_add": (C.c_int, [C.c_void_p, C.c_int, C.c_int, u32p, u16p, C.c_int, C.c_int,
                              C.c_int32, C.c_int, u8p, C.c_uint32, C.c_uint16, C.c_int]),
    "dlc_job_sparse": (C.c_int, [C.c_void_p, C.c_int, C.c_int]),
    "dlc_job_remove": (C.c_int, [C.c_void_p, C.c_int]),
    "dlc_job_set_live": (C.c_int, [C.c_void_p, C.c_int, C.c_int]),
    "dlc_job_info": (C.c_int, [C.c_void_p, C.c_int, u64p, C.POINTER(C.c_double), C.c_char_p,
                               C.c_size_t, C.c_double, u64p, C.POINTER(C.c_double),
                               C.POINTER(C.c_int), C.POINTER(C.c_int64)]),
    "dlc_take_failures": (C.c_int, [C.c_void_p, u16p, C.c_int, C.c_int]),
    "dlc_slow_next": (C.c_long, [C.c_void_p, C.c_void_p, C.c_size_t, u32p, u16p, C.c_int]),
    "dlc_ctx_new": (C.c_void_p, [C.c_void_p, C.c_int, C.c_double, C.c_uint64]),
    "dlc_ctx_free": (None, [C.c_void_p]),
    "dlc_counters": (None, [C.c_void_p, u64p]),
    "dlc_stop": (None, [C.c_void_p]),
    "dlc_process_copy": (C.c_long, [C.c_void_p, C.c_void_p, C.c_size_t, C.c_uint32,
                                    C.c_uint16, C.c_double, C.c_void_p, C.c_size_t]),
    "dlc_serve": (C.c_int, [C.c_void_p, C.c_int, C.c_double, C.c_uint64, C.c_int,
                            C.POINTER(C.c_int64)]),
    "dlc_now": (C.c_double, []),
}


@lru_cache(maxsize=1)
def _load() -> C.CDLL | str:
    path = library_path()
    if path is None:
        return (f"dlcomm's native data path is not built (no _dlc*.so in {HERE}); "
                "reinstall dlcomm with a C compiler and OpenSSL's headers (libssl-dev), "
                "or use --dataplane python")
    try:
        lib = C.CDLL(str(path))
    except OSError as exc:
        return f"cannot load dlcomm's native data path {path}: {exc}"
    for name, (restype, argtypes) in _SIGNATURES.items():
        func = getattr(lib, name, None)
        if func is None:
            continue  # a later part of the library (loadgen, client) declares its own
        func.restype = restype
        func.argtypes = argtypes
    return lib


def available() -> bool:
    return not isinstance(_load(), str)


def load() -> C.CDLL:
    """The library, or :class:`NativeMissing` with a one-line reason."""
    lib = _load()
    if isinstance(lib, str):
        raise NativeMissing(lib)
    return lib


def offload() -> bool:
    """Whether the native loops use UDP segmentation and receive offload (``$DLCOMM_GSO``
    is not ``off``). Off, every datagram crosses the kernel alone, as on a wire: a tap on
    loopback then sees the frames a wire would carry, not batches of them."""
    return os.environ.get(GSO_ENV, "on").lower() != "off"


@lru_cache(maxsize=1)
def counter_names() -> tuple[str, ...]:
    names: bytes = load().dlc_counter_names()
    return tuple(names.decode().split(","))
