"""The compiled part of dlcomm: its native data path (src/dlcomm/native/csrc), C11 against the
system's OpenSSL libcrypto, built by setuptools with the machine's compiler at install."""

from pathlib import Path

from setuptools import Extension, setup

CSRC = Path("src/dlcomm/native/csrc")

setup(ext_modules=[Extension(
    "dlcomm.native._dlc",
    sources=sorted(str(p) for p in CSRC.glob("*.c")),
    depends=sorted(str(p) for p in CSRC.glob("*.h")),
    libraries=["crypto", "m"],
    define_macros=[("_GNU_SOURCE", None)],
    extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
)])
