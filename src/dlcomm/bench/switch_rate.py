"""``dlcomm bench switch``: the switch alone, at the rate a native load generator drives it.

For each dataplane (native with 1..T threads, and the Python one), each number of workers
n and each payload size, one job is registered on a fresh ``dlcomm switch serve`` process
and the load generator (dlcomm.native.loadgen: n workers' sockets, one thread, every slot
of the job busy) runs for ``seconds``. Reported per row: aggregated input (bytes the switch
received per second, Gbit/s), the same per CPU-second of the switch process ("per core":
on a machine with fewer cores than processes it is the honest rate), per thread, packets
per second, rounds per second, and the CPU both sides used.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from dlcomm.results import new_result

__all__ = ["measure_switch", "PAYLOADS"]

PAYLOADS = {"1KB": 256, "8KB": 2048, "64KB": 16000}   # int32 elements per packet
IN_FLIGHT_BYTES = 2 << 20     # slots per job: about this many bytes of a round in flight


def _slots_for(workers: int, k: int) -> int:
    return max(4, min(256, IN_FLIGHT_BYTES // (workers * 4 * k)))


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def _one_row(service: Any, workers: int, k: int, seconds: float, auth: str,
             gso: bool) -> dict[str, Any]:
    from dlcomm.native.loadgen import run_load
    from dlcomm.sockets import set_buffers
    from dlcomm.testing.tenant import own_job
    from dlcomm.wire.auth import AUTH_MODES, key_bytes

    address, fp = service.addresses[0], service.fingerprints[0]
    slots = _slots_for(workers, k)
    job = own_job(address, fp, workers=workers, k=k, slots=slots, auth=auth)
    try:
        for sock in job.socks:
            set_buffers(sock)
        keys = b"".join(key_bytes(job.secrets[0], job.job, b"up %d" % r)
                        for r in range(workers)) if auth != "none" else b""
        pid = service.procs[0].pid
        cpu0, wall0, gen0 = _cpu_s(pid), time.perf_counter(), time.thread_time()
        stats = run_load([s.fileno() for s in job.socks], address, job.job, k, slots,
                         AUTH_MODES[auth], keys, seconds, gso)
        gen_cpu, wall = time.thread_time() - gen0, time.perf_counter() - wall0
        switch_cpu = _cpu_s(pid) - cpu0
    finally:
        job.close()
    gbit = stats["bytes"] * 8 / 1e9
    return {"workers": workers, "k": k, "payload_bytes": 4 * k, "slots": slots,
            "seconds": round(wall, 4), "input_gbps": round(gbit / wall, 4),
            "input_gbps_per_core": round(gbit / switch_cpu, 4) if switch_cpu else None,
            "packets_per_s": round(stats["packets"] / wall), "rounds_per_s":
            round(stats["rounds"] / wall), "switch_cpu_s": round(switch_cpu, 4),
            "switch_cores_used": round(switch_cpu / wall, 3),
            "loadgen_cpu_s": round(gen_cpu, 4), **stats}


def measure_switch(variants: list[tuple[str, int]], workers: list[int], payloads: list[str],
                   seconds: float, auth: str, gso: bool,
                   progress: Any = None) -> dict[str, Any]:
    """Rows of (dataplane, threads, n, payload); see the module docstring."""
    from dlcomm.switch.service import running_switches

    result = new_result("bench-switch", {"variants": [f"{d}x{t}" for d, t in variants],
                                         "workers": workers, "payloads": payloads,
                                         "seconds": seconds, "auth": auth, "gso": gso})
    rows = []
    for dataplane, threads in variants:
        args = ("--dataplane", dataplane, "--threads", str(threads), "--max-slots-per-job",
                "256")
        with running_switches("127.0.0.1", extra_args=args) as service:
            for n in workers:
                for name in payloads:
                    row = _one_row(service, n, PAYLOADS[name], seconds, auth, gso)
                    row.update(dataplane=dataplane, threads=threads, payload=name)
                    row["input_gbps_per_thread"] = round(row["input_gbps"] / threads, 4)
                    rows.append(row)
                    if progress:
                        progress(row)
    result["rows"] = rows
    result["summary"] = _summary(rows)
    return result


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per payload: the best native per-core input, and native over Python (same n)."""
    out: dict[str, Any] = {}
    for name in sorted({r["payload"] for r in rows}, key=lambda p: PAYLOADS[p]):
        native = [r for r in rows if r["payload"] == name and r["dataplane"] == "native"]
        python = {r["workers"]: r for r in rows if r["payload"] == name and
                  r["dataplane"] == "python"}
        best = max(native, key=lambda r: r["input_gbps_per_core"] or 0, default=None)
        ratios = {str(r["workers"]): round(r["input_gbps"] / python[r["workers"]]["input_gbps"], 2)
                  for r in native if r["threads"] == 1 and r["workers"] in python
                  and python[r["workers"]]["input_gbps"]}
        out[name] = {"native_best_gbps_per_core": best["input_gbps_per_core"] if best else None,
                     "native_best_at": {"workers": best["workers"], "threads": best["threads"]}
                     if best else None, "native_over_python": ratios}
    return out


def plot_switch(result: dict[str, Any], path: str) -> None:
    from dlcomm.plots import pyplot, save_figure

    plt = pyplot()
    rows = result["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (dataplane, threads) in sorted({(r["dataplane"], r["threads"]) for r in rows}):
        for n in sorted({r["workers"] for r in rows}):
            sel = sorted((r for r in rows if r["dataplane"] == dataplane and
                          r["threads"] == threads and r["workers"] == n),
                         key=lambda r: r["payload_bytes"])
            label = f"{dataplane} x{threads}, n={n}"
            xs = [r["payload_bytes"] for r in sel]
            axes[0].plot(xs, [r["input_gbps_per_core"] for r in sel], marker="o", label=label)
            axes[1].plot(xs, [r["input_gbps"] for r in sel], marker="o", label=label)
    for ax, what in zip(axes, ("input per switch core (Gbit/s per CPU-s)", "input (Gbit/s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("payload bytes per packet")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    axes[0].axhline(10, color="grey", ls="--", lw=1)
    axes[1].legend(fontsize=7)
    fig.suptitle("dlcomm switch: aggregated input, native load generator on loopback")
    save_figure(fig, path)
