"""``dlcomm advise --measure``: the cost model's constants measured on the machine at hand.

Every constant of :class:`~dlcomm.advise.cost.Constants` but the link efficiencies is a CPU
cost, so it is measured on loopback, where the CPU is the only limit: ``dlcomm bench
allreduce`` with the exchanges interleaved, repetition by repetition, at a small and two
large sizes, and a line ``t = a + b S`` fitted to each exchange by least squares on
relative residuals. Then, per exchange, with ``n`` workers and ``f`` the factor by which
they share this machine's cores (:func:`~dlcomm.advise.run.machine_factor`):

===============  =============================================================
ring             ``alpha = a / 2(n-1) f``, ``R_ring = f 2(n-1)/n 8 / b``
switch           ``o_sw = a / f``, ``R_switch = f n 8 / b`` (the switch's input is
                 the limit on loopback); ``R_client`` keeps its ratio to it
sparse-switch    8 MiB at block densities ``d`` of 5%, 25% and 100%, ``t = c + e d``:
                 ``R_sparse = f 8 S / e``, ``R_scan = f 8 S / (c - f o_sw)``
compressed       ``round_s`` = a one-round lossless compressor's (fp16) extra time
                 over the ring at the small size; ``switch_round_s`` = PowerSGD's over
                 its two switch all-reduces there, per round
===============  =============================================================

As root, the network is measured too, on an emulated star at the job's rate: the fixed
costs (ring alpha, the switch's overhead) from the small size there (a message through
namespaces and shaped veths costs more than one on loopback), and the link efficiencies
from a tensor that takes about a third of a second to cross the link: ``e = bound /
(t - fixed cost)``; where the CPU rather than the link limits that run, the efficiency
cannot be told and keeps its default (said in the result's ``notes``). Each constant's
fit error is kept: the advisor's confidence takes the worst of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from dlcomm.advise.cost import Cluster, Constants, ring_bits, ring_fixed_s, ring_messages
from dlcomm.advise.profile import DENSITY_BLOCK
from dlcomm.advise.run import machine_factor
from dlcomm.errors import ConfigError

__all__ = ["fit_line", "constants_from", "measure_constants", "with_capacity", "SIZES",
           "SPARSE_DENSITIES",
           "SPARSE_SIZE"]

SIZES = (16 * 1024, 2 * 2**20, 8 * 2**20)
SPARSE_DENSITIES = (0.05, 0.25, 1.0)
SPARSE_SIZE = 8 * 2**20
EXCHANGES = ("ring", "switch", "compressed:method=fp16,over=ring",
             "compressed:method=powersgd:rank=4,over=switch")
POWERSGD_ROUNDS = 2  # PowerSGD's collectives per bucket (P, then Q)


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """(a, b, worst relative error) of ``t = a + b x`` over (x, t) points, least squares
    weighted by 1 / t (every point counts alike, whatever its time); a, b >= 0."""
    if len(points) < 2:
        raise ConfigError("a fit needs at least two sizes")
    if any(not t > 0 for _, t in points):
        raise ConfigError("a fit needs positive times")
    w = [1 / t for _, t in points]
    sw = sum(wi * wi for wi in w)
    sx = sum(wi * wi * x for wi, (x, _) in zip(w, points))
    sxx = sum(wi * wi * x * x for wi, (x, _) in zip(w, points))
    st = sum(wi * wi * t for wi, (_, t) in zip(w, points))
    sxt = sum(wi * wi * x * t for wi, (x, t) in zip(w, points))
    det = sw * sxx - sx * sx
    if det <= 0:
        raise ConfigError("a fit needs two different sizes")
    b = (sw * sxt - sx * st) / det
    a = (st - b * sx) / sw
    if a < 0:  # no fixed cost to be seen: through the origin
        a, b = 0.0, sxt / sxx
    if b < 0:  # no cost per byte to be seen: a constant
        a, b = st / sw, 0.0
    worst = max(abs(a + b * x - t) / t for x, t in points)
    return a, b, worst


def constants_from(loopback: dict[str, list[tuple[float, float]]],
                   sparse: list[tuple[float, float]] | None, workers: int,
                   share: float, base: Constants | None = None,
                   links: dict[str, float] | None = None) -> tuple[Constants, dict[str, Any]]:
    """Constants from loopback times per exchange ((bytes, seconds) points), the sparse
    switch's ((density, seconds) at :data:`SPARSE_SIZE`), and the measured link
    efficiencies (pure)."""
    n, f = workers, share
    base = base or Constants()
    fits: dict[str, Any] = {}
    ring_a, ring_b, ring_err = fit_line(loopback["ring"])
    fits["ring"] = {"a_s": ring_a, "b_s_per_byte": ring_b, "fit_error": ring_err}
    values: dict[str, float] = {"ring_alpha_s": ring_a / ring_messages(n) / f}
    if ring_b > 0:
        values["ring_rate_bps"] = f * ring_bits(n, 1) / ring_b
    if "switch" in loopback:
        sw_a, sw_b, sw_err = fit_line(loopback["switch"])
        fits["switch"] = {"a_s": sw_a, "b_s_per_byte": sw_b, "fit_error": sw_err}
        values["switch_overhead_s"] = sw_a / f
        if sw_b > 0:
            rate = f * n * 8 / sw_b
            values["switch_rate_bps"] = rate
            values["client_rate_bps"] = rate * base.client_rate_bps / base.switch_rate_bps
        if sparse:
            sp_c, sp_e, sp_err = fit_line(sparse)
            fits["sparse-switch"] = {"a_s": sp_c, "b_s_per_density": sp_e, "fit_error": sp_err,
                                     "size_bytes": SPARSE_SIZE}
            if sp_e > 0:
                values["sparse_rate_bps"] = f * 8 * SPARSE_SIZE / sp_e
            scan_s = sp_c - f * values.get("switch_overhead_s", base.switch_overhead_s)
            if scan_s > 0:
                values["scan_rate_bps"] = f * 8 * SPARSE_SIZE / scan_s
    compressed = loopback.get(EXCHANGES[2])
    if compressed:
        small_c = min(compressed)[1]
        small_r = min(loopback["ring"])[1]
        values["round_s"] = max(0.0, small_c - small_r) / f
        fits["compressed"] = {"small_s": small_c, "ring_small_s": small_r}
    over_switch = loopback.get(EXCHANGES[3])
    if over_switch and "switch" in loopback:
        small_p = min(over_switch)[1]
        small_s = min(loopback["switch"])[1]
        values["switch_round_s"] = max(0.0, small_p - POWERSGD_ROUNDS * small_s) / \
            POWERSGD_ROUNDS / f
        fits["compressed_switch"] = {"small_s": small_p, "switch_small_s": small_s}
    values.update(links or {})
    worst = max(fit["fit_error"] for fit in fits.values() if "fit_error" in fit)
    return replace(base, **values, source="measured"), {"fits": fits, "fit_error": worst}


def _loopback(workers: int, size: int, exchanges: Sequence[str], reps: int,
              density: float = 1.0, network: Any = None) -> dict[str, float]:
    from dlcomm.bench.allreduce import AllreduceBench
    from dlcomm.bench.run import run_allreduce
    from dlcomm.emulate.placement import NetworkOptions

    bench = AllreduceBench(tuple(exchanges), workers, size, reps, 1, density=density,
                           block=DENSITY_BLOCK, interleave=True)
    result = run_allreduce(bench, network or NetworkOptions())
    return {r["exchange"]: float(r["time_s"]) for r in result["results"]}


def _network(workers: int, link_bps: float, base: Constants, reps: int,
             progress: Callable[[str], None]) -> tuple[dict[str, float], list[str]]:
    """The emulated star's own costs at the job's rate (root only): the fixed cost of a
    small message (the namespaces' path, not loopback's) and the links' efficiencies."""
    from dlcomm.emulate.placement import NetworkOptions

    n = workers
    net = NetworkOptions("emulated", f"{link_bps:.0f}bit")
    progress(f"measuring the links: {SIZES[0] // 1024} KiB on an emulated star at "
             f"{link_bps / 1e9:g} Gbit/s")
    small = _loopback(n, SIZES[0], ("ring", "switch"), reps, network=net)
    out: dict[str, float] = {}
    notes = []
    ring_wire = ring_bits(n, SIZES[0])
    ring_fixed = small["ring"] - ring_wire / (link_bps * base.ring_efficiency)
    share = machine_factor(n)
    if ring_fixed > 0:
        out["ring_alpha_s"] = ring_fixed / ring_messages(n) / share
    sw_fixed = small["switch"] - 8 * SIZES[0] / (link_bps * base.switch_efficiency)
    if sw_fixed > 0:
        out["switch_overhead_s"] = sw_fixed / share
    size = int(min(32 * 2**20, max(2**20, link_bps / 8 / 3))) // 4 * 4
    progress(f"measuring the links: {size / 2**20:.0f} MiB on an emulated star at "
             f"{link_bps / 1e9:g} Gbit/s")
    times = _loopback(n, size, ("ring", "switch"), reps, network=net)
    k = replace(base, **out)
    ring_bound = ring_bits(n, size) / link_bps
    ring_left = times["ring"] - ring_fixed_s(Cluster(n, link_bps, cpu_factor=share), k)
    if ring_bound > ring_bits(n, size) / k.ring_rate_bps * share and ring_left > 0:
        out["ring_efficiency"] = min(1.0, ring_bound / ring_left)
    else:
        notes.append("the ring's link efficiency: CPU-bound at this rate, default kept")
    sw_bound = 8 * size / link_bps
    sw_left = times["switch"] - share * k.switch_overhead_s
    if sw_bound > n * 8 * size / k.switch_rate_bps * share and sw_left > 0:
        out["switch_efficiency"] = min(1.0, sw_bound / sw_left)
    else:
        notes.append("the switch's link efficiency: CPU-bound at this rate, default kept")
    return out, notes


def with_capacity(k: Constants, workers: int, progress: Callable[[str], None]) -> Constants:
    """``k`` with this machine's capacity for emulated traffic, measured as ``dlcomm
    emulate`` measures it before choosing K (root only; kept if nothing was measured)."""
    from dlcomm.emulate.check import measure_capacity

    progress("measuring this machine's capacity for emulated traffic")
    capacity = measure_capacity(max(1, workers // 2))["capacity_bps"]
    return replace(k, emulation_capacity_bps=capacity) if capacity > 0 else k


def measure_constants(workers: int, link_bps: float, reps: int = 5,
                      progress: Callable[[str], None] = print, dilated: bool = False
                      ) -> tuple[Constants, dict[str, Any]]:
    """Measure this machine (loopback, and the links as root): (constants, details).
    ``dilated``: the job is a catalog model, verified by a time-dilated emulation, whose
    links run at the rate / K: the machine's capacity for emulated traffic (which sets K)
    is measured first, and the links at the rate they will run at."""
    n = min(workers, 8)  # more workers than this on one small machine measure the scheduler
    share = machine_factor(n)
    loopback: dict[str, list[tuple[float, float]]] = {ex: [] for ex in EXCHANGES}
    for size in SIZES:
        progress(f"measuring the data path on loopback: {size / 1024:.0f} KiB, {n} workers")
        exchanges = EXCHANGES if size == SIZES[0] else EXCHANGES[:2]
        for ex, t in _loopback(n, size, exchanges, reps).items():
            loopback[ex].append((size, t))
    sparse = []
    for density in SPARSE_DENSITIES:
        progress(f"measuring the sparse rounds: {SPARSE_SIZE / 2**20:.0f} MiB at block "
                 f"density {density:g}")
        t = _loopback(n, SPARSE_SIZE, ("sparse-switch",), reps, density=density)
        sparse.append((density, t["sparse-switch"]))
    base = Constants()
    links, notes = ({}, ["the link efficiencies: not root, defaults kept"])
    if os.geteuid() == 0:
        rate = link_bps
        if dilated:
            from dlcomm.emulate.emulation import choose_dilation

            base = with_capacity(base, workers, progress)
            rate = link_bps / choose_dilation(link_bps, workers, base.emulation_capacity_bps)
        first, _ = constants_from(loopback, sparse, n, share, base)
        links, notes = _network(n, rate, first, reps, progress)
        if dilated:
            links["emulation_capacity_bps"] = base.emulation_capacity_bps
    constants, details = constants_from(loopback, sparse, n, share, base, links)
    details.update({"workers_measured": n, "share": share, "notes": notes,
                    "points": {ex: [list(p) for p in pts] for ex, pts in loopback.items()},
                    "sparse_points": [list(p) for p in sparse],
                    "links": links, "defaults": asdict(base)})
    return constants, details
