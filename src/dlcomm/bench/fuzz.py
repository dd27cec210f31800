"""``dlcomm bench fuzz``: a bounded attack on a live switch while an honest job all-reduces.

One ``dlcomm switch serve`` process on loopback. First an unattacked run of the honest job
(``workers`` ranks of ``dlcomm bench allreduce`` through the switch, every repetition's
result hashed by every rank) gives the reference checksum. Then, while the honest job runs
again and again (a new registration each time), :mod:`dlcomm.bench.fuzz_attack` sends
``datagrams`` mutated, forged and random datagrams and ``control_lines`` hostile control
lines. The result (``kind: "bench-fuzz"``, docs/results.md) says whether the switch lived,
its resident memory before and after the attack (and sampled during it), whether every
attacked repetition's checksum equals the reference, and the amplification the attacker
measured (what came back to its sockets over what it sent, in packets and bytes).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dlcomm.bench import JOB_DEADLINE_S
from dlcomm.bench.allreduce import AllreduceBench, bench_config_dict
from dlcomm.bench.fuzz_attack import ControlAttack, DatagramAttack
from dlcomm.errors import ConfigError, DlcommError
from dlcomm.results import new_result
from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.launcher import launch
from dlcomm.runtime.placement import Placement
from dlcomm.switch.service import running_switches
from dlcomm.testing.tenant import Line

__all__ = ["FuzzBench", "run_fuzz"]

Progress = Callable[[str], None]
QUEUE_BYTES = 1 << 20   # the sender waits while this much waits at the switch's socket


@dataclass(frozen=True)
class FuzzBench:
    datagrams: int = 1_000_000
    control_lines: int = 100_000
    workers: int = 4                 # ranks of the honest job
    size_bytes: int = 1 << 22        # the honest job's tensor per worker
    reps: int = 40                   # timed repetitions per honest run (it stays live longer)
    seed: int = 0
    timeout_s: float = 3600.0        # the whole campaign

    def __post_init__(self) -> None:
        if self.datagrams < 1 or self.control_lines < 0:
            raise ConfigError("--datagrams must be >= 1 and --control-lines >= 0")
        if self.workers < 2:
            raise ConfigError(f"--workers must be >= 2, got {self.workers}")
        if self.size_bytes < 4 or self.size_bytes % 4:
            raise ConfigError("--size must be a positive multiple of 4 bytes")
        if self.reps < 1 or self.timeout_s <= 0:
            raise ConfigError("--reps must be >= 1 and --timeout-s > 0")


def rss_kib(pid: int) -> int:
    """The resident set of process ``pid``, in KiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise DlcommError(f"no VmRSS for process {pid}")


def udp_socket_state(port: int) -> tuple[int, int]:
    """The bytes queued at the UDP socket bound to ``port`` and the datagrams the kernel
    dropped there (/proc/net/udp)."""
    queued = drops = 0
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port:
            queued += int(fields[4].split(":")[1], 16)
            drops += int(fields[-1])
    return queued, drops


def kernel_drops(port: int) -> int:
    return udp_socket_state(port)[1]


class _Honest:
    """The honest job, run again and again until told to stop; every repetition's hash."""

    def __init__(self, cfg: FuzzBench, spec: str) -> None:
        self.cfg, self.spec = cfg, spec
        self.runs: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def run_once(self, tag: str) -> dict[str, Any]:
        cfg = self.cfg
        start = time.perf_counter()
        with job_directory("fuzz") as tmp:
            part = tmp / "measured.json"
            job = AllreduceBench((self.spec,), cfg.workers, cfg.size_bytes, cfg.reps, 1,
                                 cfg.seed, timeout_s=120.0, result_path=str(part),
                                 job_name=f"honest-{tag}", checksum_reps=True)
            try:
                launch(bench_config_dict(job), cfg.workers, Placement(),
                       entry=("run-job", "bench-allreduce"), deadline_s=JOB_DEADLINE_S,
                       rank0_output=False)
                entry = json.loads(part.read_text())["measured"][0]
            except (DlcommError, OSError, ValueError, KeyError) as exc:
                return {"tag": tag, "ok": False, "error": str(exc)[:300] or repr(exc),
                        "wall_s": time.perf_counter() - start}
        sums = Counter(rep["checksum"] for w in entry["per_worker"] for rep in w["reps"])
        return {"tag": tag, "ok": True, "checksums": dict(sums), "final": entry["checksum"],
                "max_abs_error": entry["max_abs_error"], "wall_s": time.perf_counter() - start}

    def start(self) -> None:
        def loop() -> None:
            while not self.stop.is_set():
                self.runs.append(self.run_once(str(len(self.runs) + 1)))
        self.thread = threading.Thread(target=loop, daemon=True, name="fuzz-honest")
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def _stats(line: Line) -> dict[str, Any]:
    reply = line.ask({"op": "stats"}, timeout=30.0)
    if not reply.get("ok"):
        raise DlcommError(f"the switch refused stats: {reply.get('error')}")
    return dict(reply["stats"])


def _attack(cfg: FuzzBench, address: tuple[str, int], fp: str, pid: int,
            alive: Callable[[], bool], progress: Progress) -> dict[str, Any]:
    """The two attackers, side by side, until both have sent their share (or the switch
    died: then what they did so far, and why they stopped)."""
    datagrams = DatagramAttack(address, fp, cfg.seed)
    try:
        control = ControlAttack(address, fp, cfg.seed + 1)
    except BaseException:
        datagrams.close()
        raise
    rss: list[tuple[float, int]] = []
    quarters: list[tuple[int, int]] = []
    failed: list[BaseException] = []
    halt = threading.Event()

    def control_loop() -> None:   # in step with the datagrams: both run the whole time
        try:
            while control.replies < cfg.control_lines and not halt.is_set():
                due = cfg.control_lines * datagrams.counts.sent // cfg.datagrams + 256
                if control.replies >= due and datagrams.counts.sent < cfg.datagrams:
                    time.sleep(0.01)
                    continue
                control.send(min(256, cfg.control_lines - control.replies))
        except BaseException as exc:  # noqa: BLE001 (reported with the result)
            failed.append(exc)

    start = time.monotonic()
    stopped: str | None = None
    thread = threading.Thread(target=control_loop, daemon=True, name="fuzz-control")
    thread.start()
    try:
        with Line(address, fp) as watch:
            last_aim = last_note = 0.0
            next_quarter = cfg.datagrams // 4   # RSS after each quarter: does it level off?
            while datagrams.counts.sent < cfg.datagrams:
                now = time.monotonic()
                if now - start > cfg.timeout_s:
                    raise DlcommError(f"the campaign took longer than {cfg.timeout_s:g} s")
                if now - last_aim > 0.5:   # find the honest job; renew failed owned jobs
                    last_aim = now
                    datagrams.aim(_stats(watch)["jobs"])
                if udp_socket_state(address[1])[0] > QUEUE_BYTES:
                    time.sleep(0.001)   # the switch is behind: let it catch up
                    continue
                datagrams.send(min(200, cfg.datagrams - datagrams.counts.sent))
                if datagrams.counts.sent >= next_quarter:
                    quarters.append((datagrams.counts.sent, rss_kib(pid)))
                    next_quarter += cfg.datagrams // 4
                if now - last_note > 5:
                    last_note = now
                    rss.append((round(now - start, 1), rss_kib(pid)))
                    progress(f"fuzz: {datagrams.counts.sent:,}/{cfg.datagrams:,} datagrams, "
                             f"{control.sent:,}/{cfg.control_lines:,} control lines, "
                             f"switch RSS {rss[-1][1] / 1024:.0f} MiB")
        thread.join(max(1.0, cfg.timeout_s - (time.monotonic() - start)))
        if thread.is_alive():
            raise DlcommError(f"the control attack took longer than {cfg.timeout_s:g} s")
    except (OSError, DlcommError) as exc:   # ssl errors are OSErrors
        if alive():
            raise
        stopped = f"the switch died: {str(exc)[:200] or type(exc).__name__}"
    finally:
        datagrams.close()
        halt.set()
        thread.join(15)
        control.close()
    if failed and alive():
        raise DlcommError(f"the control attack failed: {failed[0]!r}")
    return {"datagrams": datagrams, "control": control, "rss_samples": rss,
            "rss_quarters": quarters, "attack_s": time.monotonic() - start,
            "stopped": stopped}


def run_fuzz(cfg: FuzzBench, progress: Progress = lambda s: print(s, file=sys.stderr)
             ) -> dict[str, Any]:
    """The campaign (module docstring); its ``bench-fuzz`` result."""
    started = time.perf_counter()
    with running_switches("127.0.0.1", 1) as service:
        proc, address, fp = service.procs[0], service.addresses[0], service.fingerprints[0]
        honest = _Honest(cfg, service.spec("switch"))
        progress("fuzz: the unattacked run of the honest job")
        reference = honest.run_once("reference")
        if not reference["ok"]:
            raise DlcommError(f"the honest job failed without an attack: {reference['error']}")
        with Line(address, fp) as line:
            before = _stats(line)
        rss_before, drops_before = rss_kib(proc.pid), kernel_drops(address[1])
        honest.start()
        try:
            attack = _attack(cfg, address, fp, proc.pid, lambda: proc.poll() is None,
                             progress)
        finally:
            honest.join()
        alive = proc.poll() is None
        rss_after = rss_kib(proc.pid) if alive else None
        drops = kernel_drops(address[1]) - drops_before if alive else None
        after: dict[str, Any] = {}
        if alive:
            with Line(address, fp) as line:
                after = _stats(line)
    return _result(cfg, reference, honest.runs, attack, before, after, alive, rss_before,
                   rss_after, drops, time.perf_counter() - started)


def _result(cfg: FuzzBench, reference: dict[str, Any], runs: list[dict[str, Any]],
            attack: dict[str, Any], before: dict[str, Any], after: dict[str, Any],
            alive: bool, rss_before: int, rss_after: int | None, drops: int | None,
            wall_s: float) -> dict[str, Any]:
    d, c = attack["datagrams"], attack["control"]
    counts = d.counts
    ref_sum = reference["final"]
    attacked = [r for r in runs if r["ok"]]
    identical = bool(attacked) and all(set(r["checksums"]) == {ref_sum} for r in attacked)
    delta = {k: v - before["counters"].get(k, 0) for k, v in after.get("counters", {}).items()
             if v != before["counters"].get(k, 0)}
    result = new_result("bench-fuzz", asdict(cfg))
    result["summary"] = {
        "switch_alive": alive, "stopped": attack["stopped"],
        "rss_kib_before": rss_before, "rss_kib_after": rss_after,
        "rss_growth_kib": None if rss_after is None else rss_after - rss_before,
        "rss_growth_after_first_sample_kib": None if rss_after is None or not
        attack["rss_samples"] else rss_after - attack["rss_samples"][0][1],
        "rss_kib_after_quarters": [kib for _, kib in attack["rss_quarters"]],
        "rss_growth_second_half_kib": attack["rss_quarters"][-1][1] -
        attack["rss_quarters"][1][1] if len(attack["rss_quarters"]) >= 4 else None,
        "reference_checksum": ref_sum,
        "honest_runs": len(runs), "honest_runs_failed": len(runs) - len(attacked),
        "honest_repetitions": sum(sum(r["checksums"].values()) for r in attacked),
        "checksums_identical": identical,
        "datagrams_sent": counts.sent, "datagram_bytes_sent": counts.sent_bytes,
        "datagrams_back": counts.back, "datagram_bytes_back": counts.back_bytes,
        "amplification_packets": counts.back / max(1, counts.sent),
        "amplification_bytes": counts.back_bytes / max(1, counts.sent_bytes),
        "switch_packets_in": delta.get("packets_in", 0), "kernel_drops": drops,
        "control_lines_sent": c.sent, "control_replies": c.replies,
        "control_connections_closed": c.closed,
        "owned_jobs_registered_again": d.reregistered,
        "attacker_completions": sum(d.completions.values()),
        "switch_errors": sum(delta.get(k, 0) for k in ("dataplane_errors", "send_failures",
                                                       "control_internal_errors")),
        "attack_s": attack["attack_s"], "wall_time_s": wall_s}
    result["datagram_kinds"] = {"targets": dict(counts.kinds), "mutations": d.made()}
    result["control_kinds"] = dict(c.kinds)
    result["control_reply_kinds"] = dict(c.reply_kinds)
    result["switch_counter_deltas"] = dict(sorted(delta.items()))
    result["rss_samples_kib"] = attack["rss_samples"]
    result["honest"] = {"reference": reference, "attacked": runs}
    return result
