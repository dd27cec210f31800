"""The native data path under AddressSanitizer and UndefinedBehaviorSanitizer: the fuzz
harness (csrc/harness/fuzz_target.c) replays a seed corpus of the Python campaign's
attacks and honest rounds (dlcomm.testing.native_corpus), and inputs broken every way a record can
be; its invariants (well-formed outputs, no amplification, one answer per datagram, the
slow path's datagrams intact) abort on a violation. The coverage-guided fuzzer for gcc
(cov_fuzz.c) finds inputs that reach new edges, without crashing."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from dlcomm.native.harness import HARNESS, build_fuzzer, build_sanitized, sanitizer_env
from dlcomm.testing.native_corpus import (
    A_STRANGER,
    A_SWITCH,
    CLIENT,
    FIXED_KEYS,
    J_ENC,
    J_MAC,
    J_NONE,
    J_SLOW,
    J_SPARSE,
    SEAL,
    record,
    write_corpus,
)
from dlcomm.wire.packet import DATA, PROBE, RESULT, SWITCH_RANK, Header

HAVE_TOOLS = shutil.which("gcc") is not None and Path("/usr/include/openssl/evp.h").exists()
needs_gcc = pytest.mark.skipif(not HAVE_TOOLS, reason="the sanitizer build needs gcc and "
                               "OpenSSL's headers (/usr/include/openssl/evp.h)")
SANITIZER_ERRORS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sanitized(tmp_path_factory.mktemp("sanitized"))


def run(binary: Path, *args: str | Path, timeout: float = 40,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A harness binary on ``args`` under the sanitizers' options (and ``env``)."""
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **sanitizer_env(), **(env or {})})


def assert_clean(res: subprocess.CompletedProcess) -> None:
    assert res.returncode == 0, res.stderr[-4000:]
    for error in SANITIZER_ERRORS:
        assert error not in res.stderr, res.stderr[-4000:]


def test_the_corpus_keys_are_the_harness_keys():
    source = (HARNESS / "keys.h").read_text()
    for name, job in (("KEYS_MAC", J_MAC), ("KEYS_ENC", J_ENC), ("KEYS_SPARSE", J_SPARSE)):
        block = re.search(name + r"\[7\]\[17\] = \{(.*?)\};", source, re.S)
        assert block, f"keys.h has no {name}"
        keys = tuple(k.encode() for k in re.findall(r'"([^"]*)"', block.group(1)))
        assert keys == FIXED_KEYS[job]
        assert all(len(k) == 16 for k in keys)


@needs_gcc
def test_the_corpus_replays_clean(replay: Path, tmp_path: Path):
    paths = write_corpus(tmp_path / "corpus", 3000, seed=20261201)
    assert len(paths) >= 3
    assert sum(p.stat().st_size for p in paths) > 3000 * 35
    res = run(replay, tmp_path / "corpus")
    assert_clean(res)
    assert f"dlc_replay: {len(paths)} inputs" in res.stderr


def header(typ: int, job: int, worker: int, numel: int, counter: int = 0) -> bytes:
    return Header(typ, job, worker, 1, numel, 0, 16, 0).pack(counter)


def broken_inputs() -> dict[str, bytes]:
    """Inputs cut and sized every way the record format allows (and some it does not)."""
    big = 0xFFFF - 32
    cases = {
        "empty": b"",
        "selector-only": b"\xc0",
        "half-a-length": b"\x80\x05",
        "body-cut-short": b"\x00\x10\x00abc",
        "claims-65535": b"\x81\xff\xff" + header(DATA, J_MAC, 1, 16) + bytes(64),
        "zero-lengths": record(0, b"") * 5 + record(SEAL | CLIENT | A_SWITCH, b"")
                        + record(SEAL | A_STRANGER, b""),
        "65535-bytes": record(SEAL, header(DATA, J_MAC, 0, 0xFFFF) + bytes(big))
                       + record(SEAL | 1, header(DATA, J_ENC, 1, 0xFFFF) + bytes(big))
                       + record(2, header(DATA, J_NONE, 1, 0xFFFF) + bytes(big))
                       + record(0, header(DATA, J_SLOW, 0, 0xFFFF) + bytes(big))
                       + record(SEAL | CLIENT | A_SWITCH,
                                Header(RESULT, J_MAC, SWITCH_RANK, 0, 0xFFFF, 0, 0, 0).pack()
                                + bytes(big)),
        "past-a-reset": record(0, b"") * 4100 + record(SEAL, header(DATA, J_MAC, 0, 0)),
    }
    sizes = b""
    for n in (1, 4, 31, 32, 33, 47, 48, 49):
        for selector in (0, SEAL, CLIENT | A_SWITCH, SEAL | CLIENT | A_SWITCH, SEAL | 2):
            for job in (J_MAC, J_NONE, J_ENC, J_SLOW):
                sizes += record(selector, (header(DATA, job, 0, 4) + bytes(16))[:n])
    cases["every-size"] = sizes
    # a RESULT flagged PROBE passed the client's length check: it read 64 bytes of a 4
    to_client = SEAL | CLIENT | A_SWITCH
    cases["result-flagged-probe"] = \
        record(to_client, Header(RESULT, J_MAC, SWITCH_RANK, 0, 0, 0, 0, 3).pack(0)) \
        + record(to_client, Header(RESULT, J_MAC, SWITCH_RANK, 0, 16, 1, 0, 3,
                                   flags=PROBE).pack(1) + bytes(4))
    cases["lengths-desync"] = struct.pack("<BH", SEAL, 40) + header(DATA, J_MAC, 0, 2) \
        + struct.pack("<BH", 0, 0xFFFF)
    return cases


@needs_gcc
def test_broken_inputs_are_handled(replay: Path, tmp_path: Path):
    for name, data in broken_inputs().items():
        (tmp_path / name).write_bytes(data)
    res = run(replay, tmp_path)
    assert_clean(res)
    assert f"dlc_replay: {len(broken_inputs())} inputs" in res.stderr


@needs_gcc
def test_the_coverage_guided_fuzzer_finds_new_edges(replay: Path, tmp_path: Path):
    """From nothing but the empty input, in 3 s: more edges than its first run reached (the
    guidance works), inputs kept for them, and no crash; what it found replays clean."""
    fuzzer = build_fuzzer(tmp_path / "build", prefer_clang=False)
    found = tmp_path / "found"
    found.mkdir()
    res = run(fuzzer, "-t", "3", "-s", "7", "-o", found)
    assert res.returncode == 0, res.stderr[-4000:]
    first = re.search(r"first execution: edges (\d+)", res.stderr)
    done = re.search(r"done: execs (\d+) in \S+ s \((\d+) exec/s\), edges (\d+)", res.stderr)
    assert first and done, res.stderr[-2000:]
    assert int(done.group(3)) > int(first.group(1))
    assert not list(found.glob("crash-*")) and not list(found.glob("timeout-*"))
    assert list(found.glob("cov-*"))
    assert_clean(run(replay, found))
