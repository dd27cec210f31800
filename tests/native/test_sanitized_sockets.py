"""The worker's socket loop under AddressSanitizer and UndefinedBehaviorSanitizer: the socket
target (csrc/harness/fuzz_socket.c) plays the worker's switch on loopback sockets and sends
it the seed stories of dlcomm.testing.socket_corpus, single datagrams and UDP_SEGMENT
batches the worker receives whole and must cut back; its invariants (every datagram from
the worker a DATA of its job whose tag verifies, sent to the switch only; every datagram
sent to the worker counted once; no socket error on loopback) abort on a violation."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dlcomm.native.harness import build_fuzzer, build_sanitized
from dlcomm.testing.native_corpus import J_MAC, record
from dlcomm.testing.socket_corpus import (
    CONFIGS,
    ENCRYPT,
    MANY_SLOTS,
    RESULTS,
    RESULTS_SOCKET,
    RUN,
    SEAL,
    SPARSE,
    STORIES,
    STRANGER,
    write_socket_corpus,
)
from dlcomm.wire.packet import COMPLETE, RESULT, STATUS, SWITCH_RANK, Header
from dlcomm.wire.packet import RUN as RUN_FLAG
from dlcomm.wire.packet import SPARSE as SPARSE_FLAG
from tests.native import test_sanitized as datagrams
from tests.native.test_sanitized import needs_gcc

pytestmark = needs_gcc
STATS = re.compile(r"fuzz_socket: (\d+) records, (\d+) datagrams to the client, (\d+) from it "
                   r"checked, ops done (\d+), failed (\d+), refused (\d+)")


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sanitized(tmp_path_factory.mktemp("sanitized"), "sockets")


def run(binary: Path, *args: str | Path) -> subprocess.CompletedProcess:
    return datagrams.run(binary, *args, timeout=120, env={"DLC_FUZZ_STATS": "1"})


def assert_clean(res: subprocess.CompletedProcess) -> list[tuple[int, ...]]:
    """The run's per-input stats, once it is known to have ended clean."""
    datagrams.assert_clean(res)
    return [tuple(map(int, m)) for m in STATS.findall(res.stderr)]


def test_the_socket_corpus_replays_clean_and_reaches_the_deep_paths(replay: Path,
                                                                    tmp_path: Path):
    paths = write_socket_corpus(tmp_path / "corpus", 150, seed=20261203)
    assert len(paths) == sum(len(configs) for configs in STORIES.values())
    stats = assert_clean(run(replay, tmp_path / "corpus"))
    assert len(stats) == len(paths)
    by_name = dict(zip(sorted(p.name for p in paths), stats))   # replayed in name order
    for name, (records, sent, checked, _done, _failed, _refused) in by_name.items():
        assert records > 0 and sent > 0 and checked > 0, name
    for story in ("client", "sparse"):   # ops complete (the dense ones on two slots only)
        for config in STORIES[story]:
            if not CONFIGS[config] & MANY_SLOTS:
                assert by_name[f"{story}-{config}"][3] > 0, (story, config)
    for config in STORIES["sparse"]:     # the Python switch's answers, refused by none
        assert by_name[f"sparse-{config}"][4:] == (0, 0), config
    assert any(s[4] for s in stats)   # and some ops fail (errors, NaN results, silence)


def header(typ: int, slot: int, numel: int, seq: int = 0, counter: int = 0,
           flags: int = 0) -> bytes:
    return Header(typ, J_MAC, SWITCH_RANK, slot, numel, seq, 0, 0, flags=flags).pack(counter)


def broken_inputs() -> dict[str, bytes]:
    """Inputs cut and sized every way the configuration byte and the records allow."""
    result = header(RESULT, 0, 0)
    big = 0xFFFF
    return {
        "empty": b"",
        "configuration-only": bytes([0x0F]),
        "every-configuration-bit": b"\xff" + record(SEAL | RUN | 1, result),
        "half-a-record": b"\x00\x91\x05",
        "claims-65535": b"\x01\x91\xff\xff" + result,
        "one-byte-pieces": b"\x00" + record(SEAL | RUN | 15, b"abcdefghijklmnop"),
        "header-pieces": b"\x00" + b"".join(
            record(SEAL | RUN | n, (result + bytes(7)) * n + result[: n * 3])
            for n in range(2, 16)),
        "largest-batch": bytes([ENCRYPT]) + record(SEAL | RUN | 15, (result * 2048)[:big]),
        "largest-datagram": b"\x00" + record(SEAL | RUN | 1, (result * 2048)[:big])
                            + record(RUN | 1, bytes(big)),
        "empty-datagrams": bytes([RESULTS_SOCKET]) + record(RUN | 1, b"") * 5
                           + record(STRANGER | RUN | 1, b"") + record(RESULTS | 1, b"")
                           + record(RESULTS | STRANGER | RUN | 2, b""),
        "results-socket-absent": b"\x00" + record(SEAL | RESULTS | RUN | 3, result * 3),
        "never-run": b"\x00" + record(SEAL | 4, header(STATUS, 1, 0) * 4) * 300,
        "many-slots-silent": bytes([MANY_SLOTS | ENCRYPT]) + record(RUN, b"") * 150,
        "sparse-junk": bytes([SPARSE]) + b"".join(
            record(SEAL | RUN | 1, Header(RESULT, J_MAC, SWITCH_RANK, slot, numel, 0, 0, 0,
                                          flags=SPARSE_FLAG | extra).pack(counter)
                   + junk)
            for counter, (slot, numel, extra, junk) in enumerate(
                (s, n, e, j) for s in (0, 1) for n in (0, 4, 16, 0xFFFF)
                for e in (0, RUN_FLAG) for j in (b"", bytes(12), b"\xff" * 64,
                                                 (3).to_bytes(4, "little") * 40))),
        # 1,024 positions told their round is complete, then 30 ms in which the worker does
        # not run: 2,100 probes fall due together, 1,024 resends of 48 bytes and then 1,076
        # probes of 49, over twice the queue in one cycle and growing; the queue's earlier
        # order (flush, then queue the output already written to scratch space) sent an
        # output overwritten by later ones ("a bad header", every run)
        "queue-overflow-growing-sizes": bytes([MANY_SLOTS | ENCRYPT]) + b"".join(
            record(SEAL | len(batch), b"".join(batch)) for batch in (
                [header(STATUS, s, 0, counter=s, flags=COMPLETE) + b"\x06"
                 for s in range(i, min(i + 15, 1024))] for i in range(0, 1024, 15)))
            + record(RUN, b"") + record(0, b"") * 30 + record(RUN, b"") * 3,
        "many-slots-statuses": bytes([MANY_SLOTS]) + b"".join(
            record(SEAL | 15, b"".join(header(STATUS, s, 0, counter=s, flags=COMPLETE) + b"\x06"
                                       for s in range(i, i + 15)))
            for i in range(0, 2100, 15)) + record(RUN, b"") * 40,
    }


# inputs the fuzzer broke the harness's invariants with, kept as they were found:
# socket-two-sends-in-one-batch: two requests to send a round again, read in one batch,
# made the worker send its packet's second sealing under the first one's length
FOUND = Path(__file__).parent / "data"


def test_broken_socket_inputs_are_handled(replay: Path, tmp_path: Path):
    for name, data in broken_inputs().items():
        (tmp_path / name).write_bytes(data)
    found = sorted(FOUND.glob("socket-*"))
    for path in found:
        shutil.copy(path, tmp_path / path.name)
    res = run(replay, tmp_path)
    stats = assert_clean(res)
    assert found
    assert f"dlc_replay: {len(broken_inputs()) + len(found)} inputs" in res.stderr
    assert len(stats) == len(broken_inputs()) + len(found)


def test_the_socket_fuzzer_runs_from_the_seeds(replay: Path, tmp_path: Path):
    """gcc's coverage-guided driver on this target, with -H 1 (its records begin after the
    configuration byte): 40 inputs from the seeds, no crash or timeout, and what it kept
    replays clean under the sanitizers."""
    fuzzer = build_fuzzer(tmp_path / "build", prefer_clang=False, target_name="sockets")
    seeds, found = tmp_path / "seeds", tmp_path / "found"
    write_socket_corpus(seeds, 10, seed=3)
    found.mkdir()
    res = run(fuzzer, "-n", "40", "-s", "5", "-H", "1", "-o", found, seeds)
    assert res.returncode == 0, res.stderr[-4000:]
    loaded = re.search(r"seeds loaded: execs \d+ in \S+ s \(\d+ exec/s\), edges (\d+)",
                       res.stderr)
    done = re.search(r"done: execs (\d+) in \S+ s \((\d+) exec/s\), edges (\d+)", res.stderr)
    assert loaded and done, res.stderr[-2000:]
    assert int(done.group(1)) >= 40
    assert not list(found.glob("crash-*")) and not list(found.glob("timeout-*"))
    assert_clean(run(replay, seeds, found))
