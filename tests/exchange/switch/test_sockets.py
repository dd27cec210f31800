"""The switch exchange over real UDP sockets on loopback, with faults and bad actors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlcomm.switch.client import request_once
from dlcomm.switch.service import running_switches
from tests.conftest import Rendezvous, UnusedPort

HERE = Path(__file__).parent


def run_ranks(spec: str, mode: str, world: int = 3, numel: int = 50_000, seed: int = 0,
              timeout: float = 90, kill_switch_after: tuple | None = None) -> list[dict]:
    rdzv = Rendezvous()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               **rdzv.env, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(HERE / "switch_worker.py"), spec,
                                       mode, str(numel), str(seed)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    if kill_switch_after:
        delay, proc = kill_switch_after
        time.sleep(delay)
        proc.kill()
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
            outs.append(json.loads(lines[-1]) if lines
                        else {"error": f"no output: {stderr[-500:]}"})
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


_CLEAN: dict[tuple[int, int], str] = {}


def clean_checksum(service, seed: int, numel: int) -> str:
    """The checksum of an undisturbed sum of ``seed``'s tensors (once per module: the
    switch and the client do not change an exact sum)."""
    if (seed, numel) not in _CLEAN:
        outs = run_ranks(spec(service), "sum", seed=seed, numel=numel)
        assert len({o.get("checksum") for o in outs}) == 1, outs
        _CLEAN[(seed, numel)] = outs[0]["checksum"]
    return _CLEAN[(seed, numel)]


@pytest.fixture
def switch():
    with running_switches("127.0.0.1", 1) as service:
        yield service


def spec(service, **opts):
    options = {**service.spec_options(), "k": 1000, "window": 4, **opts}
    return "switch:" + ",".join(f"{k}={v}" for k, v in options.items())


def stats_of(service, index=0):
    return request_once(service.addresses[index], service.fingerprints[index],
                        {"op": "stats"})["stats"]


@pytest.mark.parametrize("client", ["native", "python"])
def test_auto_learns_a_dense_rounds_density_from_its_sums(switch, client):
    """auto's first op is sparse and finds every block present, so the next is dense: the
    density it records after it must be that op's own (half the blocks), counted by the
    native client as the results come in or read from the sums by the Python one."""
    auto = spec(switch, k=1024, client=client).replace("switch:", "auto:", 1)
    outs = run_ranks(auto, "halves", numel=51_200)
    for out in outs:
        assert "error" not in out, out
        extra = out["stats"]
        assert (extra["sparse_ops"], extra["dense_ops"]) == (1, 1)
        assert extra["block_density"] == {"None": 0.5}


def test_exact_and_reproducible_under_loss(switch):
    clean = run_ranks(spec(switch), "sum")
    lossy = run_ranks(spec(switch, drop=0.05, seed=3), "sum")
    failed = [(o["rank"] if "rank" in o else "?", o.get("error")) for o in clean + lossy
              if "checksum" not in o]
    assert not failed, failed
    # every rank, with or without loss
    assert len({o["checksum"] for o in clean + lossy}) == 1, [
        (o["rank"], o["checksum"][:12], o["stats"].get("retransmissions"),
         o["stats"].get("drops_injected")) for o in clean + lossy]
    assert clean[0]["max_abs_error"] < 1e-5
    assert any(o["stats"]["drops_injected"] for o in lossy)
    assert clean[0]["stats"]["counting"] == "measured"
    assert clean[0]["stats"]["bytes_sent"] >= 50_000 * 4


def _packets_out(service) -> int:
    return stats_of(service)["counters"].get("packets_out", 0)


@pytest.mark.parametrize("client", ["native", "python"])
def test_workers_of_one_host_take_each_result_from_their_group(switch, client):
    """Three workers on loopback: the job gets a multicast group and the switch sends each
    result once, not once per worker; the sums are the same as with results sent to every
    worker in turn (``multicast=off``)."""
    before = _packets_out(switch)
    grouped = run_ranks(spec(switch, client=client), "sum")
    middle = _packets_out(switch)
    each = run_ranks(spec(switch, client=client, multicast="off"), "sum")
    after = _packets_out(switch)
    failed = [o.get("error") for o in grouped + each if "checksum" not in o]
    assert not failed, failed
    assert len({o["checksum"] for o in grouped + each}) == 1 and \
        grouped[0]["max_abs_error"] < 1e-5
    assert all(o["stats"]["multicast"] for o in grouped)
    assert not any(o["stats"]["multicast"] for o in each)
    chunks = 50_000 // 1000
    assert middle - before < 2 * chunks <= 3 * chunks <= after - middle, (before, middle, after)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_bind_the_port_results_come_to():
    """The results socket of workers that share a host (bootstrap._common_socket) shares its
    port with its own user's processes only: another user of the host can bind it neither
    alongside (SO_REUSEPORT, SO_REUSEADDR) nor on the group's address, so it cannot read the
    results (in clear in mode ``authenticated``)."""
    from dlcomm.exchange.switch.bootstrap import _common_socket

    sock = None
    for port in range(47000, 47100):
        sock = _common_socket(port, shared=True)
        if sock is not None:
            break
    assert sock is not None
    try:
        same = _common_socket(port, shared=True)   # a worker of the same user, alongside
        assert same is not None
        same.close()
        child = os.fork()
        if child == 0:  # pragma: no cover (the child reports by its exit status)
            os.setgid(65534)
            os.setuid(65534)
            bound = 0
            for option, host in ((socket.SO_REUSEPORT, "0.0.0.0"),
                                 (socket.SO_REUSEADDR, "0.0.0.0"),
                                 (socket.SO_REUSEADDR, "239.1.2.3")):
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
                    other.setsockopt(socket.SOL_SOCKET, option, 1)
                    try:
                        other.bind((host, port))
                        bound += 1
                    except OSError:
                        pass
            os._exit(bound)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        sock.close()


def test_sharded_over_two_switches():
    with running_switches("127.0.0.1", 2) as service:
        outs = run_ranks(spec(service), "sum")
        stats = [stats_of(service, i) for i in range(2)]
    assert len({o["checksum"] for o in outs}) == 1 and outs[0]["max_abs_error"] < 1e-5
    assert all(s["counters"]["completions"] > 0 for s in stats)  # both shards carried chunks


def test_dead_worker_is_named(switch):
    outs = run_ranks(spec(switch, deadline_s=20), "die")
    for o in outs[:2]:
        assert "worker rank 2 left the job" in o["error"]
        assert o["error_after_s"] < 10


def test_hung_worker_is_named_within_the_deadline(switch):
    outs = run_ranks(spec(switch, deadline_s=3), "hang", timeout=120)
    for o in outs[:2]:
        assert "still waiting for rank(s) 2" in o["error"], o
        assert o["error_after_s"] < 10


def test_nan_fails_every_worker(switch):
    outs = run_ranks(spec(switch), "nan")
    assert all("NaN or Inf" in o["error"] for o in outs), outs
    assert "rank 1" in outs[1]["error"]


def test_workers_that_disagree_get_an_error(switch):
    outs = run_ranks(spec(switch, deadline_s=10), "mismatch")
    assert all("tensors differ" in o.get("error", "") for o in outs), outs
    assert "50007 elements" in outs[1]["error"] or "50007" in outs[0]["error"]


def test_killed_switch_fails_clients_fast():
    with running_switches("127.0.0.1", 1) as service:
        outs = run_ranks(spec(service, deadline_s=30), "many", numel=2_000_000,
                         kill_switch_after=(4.0, service.procs[0]))
    assert all("error" in o for o in outs), outs
    assert all("lost the control connection" in o["error"] or "cannot reach" in o["error"]
               for o in outs), outs


def test_no_switch_running():
    with UnusedPort() as unused:
        outs = run_ranks(f"switch:addr=127.0.0.1:{unused.port},fp={'0' * 64}", "sum")
    assert all("cannot reach the switch" in o["error"] for o in outs), outs


def test_concurrent_jobs_do_not_interfere(switch):
    results: dict[str, list] = {}
    import threading

    def job(name, seed):
        results[name] = run_ranks(spec(switch), "sum", world=2, seed=seed)

    threads = [threading.Thread(target=job, args=(n, s)) for n, s in (("a", 1), ("b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alone = run_ranks(spec(switch), "sum", world=2, seed=2)
    assert results["b"][0]["checksum"] == alone[0]["checksum"]
    assert results["a"][0]["max_abs_error"] < 1e-5


def test_switch_stats_cli(switch):
    res = subprocess.run([sys.executable, "-m", "dlcomm", "switch", "stats", "--switch",
                          switch.spec_addr, "--fingerprint", switch.fingerprints[0], "--json"],
                         capture_output=True, text=True, timeout=30)
    stats = json.loads(res.stdout)
    assert stats["slots_total"] == 1024 and "counters" in stats


def test_serve_bad_bind():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        taken = s.getsockname()[1]
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", taken))
        res = subprocess.run([sys.executable, "-m", "dlcomm", "switch", "serve", "--bind",
                              f"127.0.0.1:{taken}"], capture_output=True, text=True, timeout=30)
        udp.close()
    assert res.returncode == 2 and "cannot listen on" in res.stderr


def _worker_udp_ports() -> set[int]:
    import psutil

    ports = set()
    for proc in psutil.process_iter(["cmdline"]):
        if any("switch_worker.py" in part for part in proc.info["cmdline"] or ()):
            try:
                ports |= {c.laddr.port for c in proc.net_connections(kind="udp")}
            except psutil.Error:
                pass
    return ports


class _GsoJunk:
    """A neighbour on the host sending ``ports()`` GSO batches of junk and of header-shaped
    forgeries of ``typ`` (odd segment sizes, short last segments), from a thread, until
    stopped: the ports it hit, one entry per batch sent."""

    def __init__(self, ports, typ: int, worker: int) -> None:
        import random
        import threading

        self.ports, self.typ, self.worker = ports, typ, worker
        self.rng, self.hits = random.Random(3), []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._blast)

    def __enter__(self) -> _GsoJunk:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def _batch(self) -> tuple[int, bytes]:
        """Junk (40%), header-shaped cuts of any length (30%), or forgeries of a plausible
        shape: 1,000 values and a tag, the length their header says (30%)."""
        from dlcomm.wire.packet import Header, encode

        rng = self.rng
        roll = rng.random()
        seg = 4048 if roll >= 0.7 else rng.choice([1, 7, 33, 500, 1400, 4096, 8000])
        count = rng.randint(1, min(8, 64_000 // seg))
        if roll < 0.4:
            return seg, os.urandom(seg * count - rng.randint(0, seg - 1))
        hdr = Header(self.typ, rng.randint(0, 8), self.worker, rng.randint(0, 3), 1000,
                     rng.randint(0, 40), 0, 20, rng.getrandbits(64))
        one = (encode(hdr, os.urandom(max(0, seg - 32))) + os.urandom(16))[:seg]
        return seg, one * count

    def _blast(self) -> None:
        udp_segment = getattr(socket, "UDP_SEGMENT", 103)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            while not self.stop.is_set():
                for port in self.ports():
                    seg, body = self._batch()
                    try:
                        tx.setsockopt(socket.SOL_UDP, udp_segment, seg)
                        tx.sendto(body, ("127.0.0.1", port))
                        self.hits.append(port)
                    except OSError:
                        pass
                time.sleep(0.002)


@pytest.mark.parametrize("client", ["native", "python"])
def test_junk_batches_at_the_workers_do_not_disturb_a_job(switch, client):
    """A neighbour on the host sends the workers' UDP sockets (their own and the group's)
    GSO batches of junk and of header-shaped forgeries, with odd segment sizes and short
    last segments, while they all-reduce: the batches arrive whole (GRO) and are cut and
    refused, and the sums stay exact."""
    from dlcomm.wire.packet import RESULT, SWITCH_RANK

    NUMEL = 4_000_000  # noqa: N806
    with _GsoJunk(_worker_udp_ports, RESULT, SWITCH_RANK) as junk:
        attacked = run_ranks(spec(switch, client=client), "sum", seed=7, numel=NUMEL)
    failed = [o.get("error") for o in attacked if "checksum" not in o]
    assert not failed, failed
    assert {o["checksum"] for o in attacked} == {clean_checksum(switch, 7, NUMEL)}
    assert len(junk.hits) > 100
    assert sum(o["stats"]["refused"] for o in attacked) > 0   # junk reached the ops


def test_junk_batches_at_the_switch_do_not_disturb_a_job(switch):
    """The same neighbour sends the switch's data port junk and DATA forgeries, single
    datagrams and GSO batches, while a job all-reduces: the switch cuts the batches (GRO)
    and drops every datagram of them, and the sums stay exact."""
    from dlcomm.wire.packet import DATA

    NUMEL = 4_000_000  # noqa: N806
    before = stats_of(switch)["counters"]
    port = switch.addresses[0][1]   # the data plane's UDP port is the control port's number
    with _GsoJunk(lambda: [port], DATA, 1) as junk:
        attacked = run_ranks(spec(switch), "sum", seed=7, numel=NUMEL)
    failed = [o.get("error") for o in attacked if "checksum" not in o]
    assert not failed, failed
    assert {o["checksum"] for o in attacked} == {clean_checksum(switch, 7, NUMEL)}
    assert len(junk.hits) > 100
    after = stats_of(switch)["counters"]
    dropped = sum(after[k] - before.get(k, 0) for k in after if k.startswith("drop_"))
    assert dropped > 100


@pytest.mark.parametrize("dataplane", ["native", "python"])
def test_the_switch_imports_nothing_once_it_listens(dataplane):
    """A module imported after the switch listens needs a free file descriptor, and a flood of
    control connections may have taken them all (the switch once stopped so, importing its
    packet loop). Python reports each import as it happens, so the log shows any that come
    after the listening line: a dense and a sparse job, a statistics request and a metrics
    scrape must add none."""
    from tests.switch.test_metrics import free_port, scrape

    port = free_port()
    with running_switches("127.0.0.1", prefix=["env", "PYTHONPROFILEIMPORTTIME=1"],
                          extra_args=["--dataplane", dataplane,
                                      "--metrics", f"127.0.0.1:{port}"]) as service:
        outs = run_ranks(spec(service), "sum") + run_ranks(
            "sparse-" + spec(service, k=1024, block=256), "sum")
        assert all("checksum" in o for o in outs), outs
        assert stats_of(service)["counters"]["completions"] > 0
        assert "dlcomm_switch_completions" in scrape(port)
        log = service.logs[0].read_text(errors="replace")
    after = log[log.index("dlcomm switch listening on"):].splitlines()[1:]
    late = [line for line in after if line.startswith("import time:")]
    assert not late, "imported after listening:\n" + "\n".join(late[:20])
