"""Builds of the native fuzz harness (csrc/harness/): a sanitizer replay and a fuzzer, of
either target (:data:`TARGETS`):

- ``datagrams`` (fuzz_target.c): the switch's dataplane and the worker's state machine fed
  datagrams through their socket-free calls;
- ``sockets`` (fuzz_socket.c): the worker's socket loop (batched receives, GRO batches cut
  back into datagrams, the output queue and its flushes) on loopback sockets.

- :func:`build_sanitized`: ``dlc_replay`` (``dlc_replay_sockets``), the library's sources,
  the target and replay_main.c under AddressSanitizer and UndefinedBehaviorSanitizer; it
  runs the target once on every file (or directory of files) it is given;
- :func:`build_fuzzer`: ``dlc_fuzz`` (``dlc_fuzz_sockets``), with clang's libFuzzer where
  clang is on PATH, else gcc with cov_fuzz.c (coverage through
  -fsanitize-coverage=trace-pc), both under the same sanitizers;
- :func:`build_threads`: ``dlc_threads``, the library and threads_main.c under
  ThreadSanitizer: a switch's serving threads, load generators, the slow path's reader and
  the control plane's calls at once, on loopback.

A missing compiler or missing OpenSSL headers is a one-line :class:`ConfigError`. Usage::

    python -m dlcomm.native.harness sanitized OUT_DIR [--target sockets]   # prints its path
    python -m dlcomm.native.harness fuzzer OUT_DIR [--gcc] [--target sockets]
    python -m dlcomm.native.harness threads OUT_DIR
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

from dlcomm.errors import ConfigError

__all__ = ["build_sanitized", "build_fuzzer", "build_threads", "sanitizer_env", "threads_env",
           "CSRC", "HARNESS", "TARGETS"]

CSRC = Path(__file__).resolve().parent / "csrc"
HARNESS = CSRC / "harness"
COMMON = ["-std=c11", "-D_GNU_SOURCE", "-O1", "-g", "-Wall", "-Wextra"]
SANITIZE = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer"]
LIBS = ["-lcrypto", "-lm", "-lpthread"]
# a target's source and the suffix of its binaries' names
TARGETS = {"datagrams": ("fuzz_target.c", ""), "sockets": ("fuzz_socket.c", "_sockets")}


def sanitizer_env() -> dict[str, str]:
    """The sanitizers' options for a run: leaks count, the first report stops the run."""
    return {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


def library_sources() -> list[Path]:
    """The library's C sources, as setup.py compiles them."""
    return sorted(CSRC.glob("*.c"))


def _compiler(name: str) -> str:
    """The compiler's path, once it is known to find OpenSSL's headers."""
    path = shutil.which(name)
    if path is None:
        raise ConfigError(f"building the native fuzz harness needs {name} on PATH "
                          "(apt-get install gcc)")
    probe = subprocess.run([path, "-E", "-x", "c", "-o", "/dev/null", "-"],
                           input="#include <openssl/evp.h>\n", capture_output=True, text=True,
                           timeout=60)
    if probe.returncode != 0:
        raise ConfigError(f"building the native fuzz harness needs OpenSSL's headers "
                          f"(openssl/evp.h; apt-get install libssl-dev): {name} cannot find "
                          "them")
    return path


def _run(command: list[str], target: Path) -> None:
    res = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        errors = [line for line in res.stderr.splitlines() if "error" in line]
        first = (errors or res.stderr.splitlines() or ["no output"])[0]
        raise ConfigError(f"building {target.name} failed: {first}")


def _target(name: str) -> tuple[Path, str]:
    if name not in TARGETS:
        raise ConfigError(f"unknown fuzz target {name!r} (one of {', '.join(TARGETS)})")
    source, suffix = TARGETS[name]
    return HARNESS / source, suffix


def _link(out_dir: str | Path, name: str, sources: list[Path], flags: list[str],
          compiler: str = "gcc") -> Path:
    """``out_dir/name``: ``sources`` compiled and linked with ``flags`` (and the library's
    dependencies)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / name
    _run([_compiler(compiler), *COMMON, *flags, *map(str, sources), "-o", str(target), *LIBS],
         target)
    return target


def build_sanitized(out_dir: str | Path, target_name: str = "datagrams") -> Path:
    """``out_dir/dlc_replay``: the fuzz target under ASan and UBSan, run on given files."""
    source, suffix = _target(target_name)
    return _link(out_dir, f"dlc_replay{suffix}",
                 [*library_sources(), source, HARNESS / "replay_main.c"], SANITIZE)


def build_threads(out_dir: str | Path) -> Path:
    """``out_dir/dlc_threads``: threads_main.c and the library under ThreadSanitizer (its
    report ends the run with exit code 66 under :func:`threads_env`)."""
    return _link(out_dir, "dlc_threads", [*library_sources(), HARNESS / "threads_main.c"],
                 ["-fsanitize=thread"])


def threads_env() -> dict[str, str]:
    """ThreadSanitizer's options: the first report ends the run, exit code 66."""
    return {"TSAN_OPTIONS": "halt_on_error=1:exitcode=66"}


def build_fuzzer(out_dir: str | Path, prefer_clang: bool = True,
                 target_name: str = "datagrams") -> Path:
    """``out_dir/dlc_fuzz``: libFuzzer's (clang) or cov_fuzz.c's (gcc) coverage-guided
    fuzzer around the target, under ASan and UBSan. Their command lines differ (libFuzzer:
    ``-max_total_time=S DIR``; cov_fuzz: ``-t S -o DIR SEEDS``)."""
    source, suffix = _target(target_name)
    name, sources = f"dlc_fuzz{suffix}", [*library_sources(), source]
    if prefer_clang and shutil.which("clang"):
        flags = [flag.replace("address,undefined", "fuzzer,address,undefined")
                 for flag in SANITIZE]
        return _link(out_dir, name, sources, flags, compiler="clang")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    driver = out / "cov_fuzz.o"   # built without trace-pc: the driver is not what is measured
    _run([_compiler("gcc"), *COMMON, *SANITIZE, "-c", str(HARNESS / "cov_fuzz.c"), "-o",
          str(driver)], driver)
    return _link(out_dir, name, [*sources, driver],
                 [*SANITIZE, "-fsanitize-coverage=trace-pc"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlcomm.native.harness",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("kind", choices=("sanitized", "fuzzer", "threads"))
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--gcc", action="store_true", help="the gcc fuzzer even if clang exists")
    parser.add_argument("--target", choices=sorted(TARGETS), default=None,
                        help="what the fuzz harness drives (default: datagrams)")
    args = parser.parse_args(argv)
    if args.kind == "threads" and (args.target or args.gcc):
        parser.error("threads takes no --target or --gcc")
    args.target = args.target or "datagrams"
    try:
        if args.kind == "threads":
            path = build_threads(args.out_dir)
        elif args.kind == "sanitized":
            path = build_sanitized(args.out_dir, args.target)
        else:
            path = build_fuzzer(args.out_dir, prefer_clang=not args.gcc, target_name=args.target)
    except ConfigError as exc:
        parser.exit(2, f"dlcomm: error: {exc}\n")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
