"""The advisor's cost model: one iteration of a profile through one candidate (pure).

An iteration is forward, then backward, during which DDP hands over each gradient bucket
as it fills; buckets are reduced one after another, each starting when it is ready and
the previous one is done (``dlcomm.timeline.finish_time``); the optimizer runs when
backward and the last bucket are done. A bucket of ``S`` bytes, ``n`` workers, ``B`` bit/s:

=================  ==========================================================  ==========
candidate          time                                                         limited by
=================  ==========================================================  ==========
ring               ``2(n-1) alpha + max(2(n-1)/n S / (B e_ring),``              links or
                   ``2(n-1)/n S / R_ring)``                                     CPU
switch             ``o_sw + max(S / (B e_sw), n S / R_switch, S / R_client)``   links, or
                                                                                switch/worker
                                                                                CPU
sparse-switch      as switch with ``S d (1 + 1/block)`` on the wire, and        links or
                   ``S / R_scan + d S / R_sparse`` of sparse rounds per worker  CPU
                   (native at both ends)
auto               as it decides: sparse-switch below its threshold of the result's
                   block density (``auto_sparse_below(n)``), else switch
compressed         the inner exchange on ``r S`` (summable methods) or an        links or
                   all-gather of ``(n-1) r S``, plus ``S / R_compress`` and a    CPU
                   Python cost per collective round (over gloo or the switch)
hop, prague        no buckets: the model once the step is computed, to two      links or
                   ring neighbours (hop, overlapping the compute) or a group    CPU
                   of four (prague), plus the protocol's CPU per iteration
                   (:func:`sync_costs`, measured by :func:`protocol_cpu_s`)
=================  ==========================================================  ==========

``d`` is the gradients' block density, ``r`` the method's measured wire ratio and
``R_compress`` its measured rate on this CPU. The switch serves a job of at most 64 workers
in its native dataplane (``R_switch``), a larger one in its Python dataplane
(``R_switch_py``), dense or sparse alike. Every cost but the links' is a CPU cost:
measured per core of this machine, and multiplied by the cluster's ``cpu_factor`` (the
cores the workers share here, or hosts faster than this core; a time-dilated emulation's
hosts are K times faster). The constants (:class:`Constants`) default to what dlcomm
measured on its reference machine, and ``dlcomm advise --measure`` measures them on the
machine at hand (:mod:`dlcomm.advise.measure`, docs/advise.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from dlcomm.advise.profile import DENSITY_BLOCK, JobProfile
from dlcomm.errors import ConfigError
from dlcomm.exchange.switch.exchange import auto_sparse_below
from dlcomm.native.switch import MAX_NATIVE_WORKERS
from dlcomm.timeline import finish_time
from dlcomm.volume import ring_allreduce_factor

__all__ = ["Constants", "Cluster", "Candidate", "Prediction", "bucket_time", "predict",
           "sync_costs", "protocol_cpu_s", "load_constants", "HOP_DEGREE", "gather_fixed_s",
           "PRAGUE_GROUP", "ring_fixed_s", "ring_messages", "ring_bits",
           "tcp_link_efficiency", "switch_link_efficiency", "EMULATED_MTU"]

HOP_DEGREE = 2     # ``--sync hop``'s graph, a ring: two in- and two out-neighbours
PRAGUE_GROUP = 4   # ``--sync prague``'s group size

EMULATED_MTU = 9000  # the MTU of dlcomm's emulated links, where --verify runs
ETHERNET = 14        # what a shaper counts of a frame beyond its IP packet
TCP_HEADERS = 20 + 20 + 12  # IPv4, TCP, the timestamps option


def tcp_link_efficiency(mtu: int) -> float:
    """gloo's payload over what its TCP streams put on a link of ``mtu``: full segments,
    and the delayed ACK (one per two segments) of the stream coming the other way, since
    every ring link carries data both ways (pure)."""
    payload = mtu - TCP_HEADERS
    return payload / (mtu + ETHERNET + (TCP_HEADERS + ETHERNET) / 2)


def switch_link_efficiency(mtu: int) -> float:
    """The switch's payload over its frames on a link of ``mtu``: one frame-sized packet
    of k elements (the dense default, ``switch:mtu``), headers and tag around it (pure)."""
    from dlcomm.exchange.switch.spec import FRAME_OVERHEAD, k_for_mtu

    payload = 4 * k_for_mtu(mtu, DENSITY_BLOCK)
    return payload / (payload + FRAME_OVERHEAD + ETHERNET)


@dataclass(frozen=True)
class Constants:
    """Per-exchange constants of the cost model (bits per second unless named _s)."""

    # CPU costs per core of dlcomm's 2-core reference machine: the medians of six
    # ``advise --measure`` runs of 4 workers (docs/advise.md)
    ring_alpha_s: float = 0.43e-3    # one ring message's fixed cost (gloo, veth, wake-ups)
    # achieved / link rate: the headers' share of the emulated links' frames (MTU 9000)
    ring_efficiency: float = field(default_factory=lambda: tcp_link_efficiency(EMULATED_MTU))
    switch_overhead_s: float = 0.97e-3  # one switch all-reduce's fixed cost
    switch_efficiency: float = field(
        default_factory=lambda: switch_link_efficiency(EMULATED_MTU))
    switch_rate_bps: float = 18.9e9  # the native switch's input (tags on)
    python_switch_rate_bps: float = 6e9  # the Python dataplane's (jobs of over 64 workers)
    client_rate_bps: float = 15.12e9  # one worker's native client (0.8 x the switch's)
    sparse_rate_bps: float = 6.1e9   # one worker's native sparse rounds, per non-zero bit
    scan_rate_bps: float = 27.9e9    # finding the non-zero blocks, per dense bit
    round_s: float = 1.5e-3          # a compressed exchange's Python per round over gloo
    switch_round_s: float = 0.2e-3   # the same per round over the switch (GIL released)
    ring_rate_bps: float = 23.4e9    # gloo's TCP send + receive per worker core
    emulation_capacity_bps: float = 30e9  # emulated traffic this machine carries (all links)
    source: str = "defaults"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> Constants:
        known = {f for f in cls.__dataclass_fields__ if f != "source"}
        unknown = set(data) - known - {"source"}
        if unknown:
            raise ConfigError(f"{source}: unknown constant {sorted(unknown)[0]!r}")
        values = {}
        for name in known & set(data):
            value = data[name]
            fixed = name.endswith("_s")  # a fixed cost may be 0; a rate or efficiency not
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not (value >= 0 if fixed else value > 0) or value == float("inf") or \
                    (name.endswith("_efficiency") and value > 1):
                want = "a finite number >= 0" if fixed else "in (0, 1]" \
                    if name.endswith("_efficiency") else "a finite number > 0"
                raise ConfigError(f"{source}: {name} must be {want}, got {value!r}")
            values[name] = float(value)
        return cls(**values, source=str(data.get("source", source)))


def load_constants(path: str) -> Constants:
    """The constants of a calibration file: an ``advise`` result (its ``constants``) or a
    bare object of constants."""
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--calibration: no such file {path}") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"--calibration: cannot read {path}: {err}") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict) and \
            "constants" in data["config"]:
        data = data["config"]["constants"]
    if not isinstance(data, dict) or not set(data) - {"source"}:
        raise ConfigError(f"--calibration: {path} holds no constants")
    return Constants.from_dict(data, path)


@dataclass(frozen=True)
class Cluster:
    """Where the job runs: workers and their links."""

    workers: int
    link_bps: float
    topology: str = "star"
    compute_factor: float = 1.0      # compute slowed by sharing cores (verification here)
    cpu_factor: float = 1.0          # the data path's CPU costs over this machine's per core
    delay_s: float = 0.0             # waited before backward each step (stragglers)

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ConfigError(f"--workers must be >= 2, got {self.workers}")
        if not self.link_bps > 0:
            raise ConfigError("the link rate must be positive")
        if not self.cpu_factor > 0:
            raise ConfigError("the hosts' CPU speed must be positive")


@dataclass(frozen=True)
class Candidate:
    """One way to exchange gradients, with the measured facts of its compressor."""

    exchange: str                      # ring | switch | sparse-switch | auto
    method: str | None = None          # compressor spec
    ratio: float = 1.0                 # wire bytes per float32 byte (before the collective)
    summable: bool = True
    compress_bps: float = float("inf")  # compress + decompress rate, float32 bits/s
    sync: str = "bsp"
    rounds: int = 1                    # collectives per bucket (PowerSGD: 2)
    iteration_cpu_s: float | None = None  # hop/prague: protocol CPU per iteration, measured
    floor_s: float | None = None       # its step measured on loopback, on shared cores
    # (elements, ratio, compress_bps) measured at several bucket sizes, if any: a
    # compressor's rate depends on the bucket's size (caches), PowerSGD's ratio too
    sizes: tuple[tuple[int, float, float], ...] = ()

    def at(self, elements: float) -> tuple[float, float]:
        """(ratio, compress_bps) for a bucket of ``elements``: those measured at the size
        nearest to it (by ratio of sizes), or the candidate's own."""
        if not self.sizes or elements <= 0:
            return self.ratio, self.compress_bps
        _, ratio, rate = min(self.sizes, key=lambda s: abs(math.log(s[0] / elements)))
        return ratio, rate

    @property
    def label(self) -> str:
        base = self.exchange if self.method is None else \
            f"compressed:method={self.method},over={self.exchange}"
        return base if self.sync == "bsp" else f"{base} --sync {self.sync}"


@dataclass(frozen=True)
class Prediction:
    candidate: str
    iteration_s: float
    compute_s: float
    comm_s: float              # total time buckets spent in their exchange
    exposed_s: float           # communication not hidden behind compute
    limiter: str               # compute | links | switch CPU | worker CPU | cores
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def exposed_share(self) -> float:
        return self.exposed_s / self.iteration_s if self.iteration_s else 0.0


def _switch_time(nbytes: float, c: Cluster, k: Constants,
                 sparse_density: tuple[float, float] | None
                 ) -> tuple[float, dict[str, float]]:
    bits = 8 * nbytes
    if sparse_density is None:
        wire = up = bits
        cpu_worker = bits / k.client_rate_bps
    else:  # each worker sends its own blocks and gets back the union of everyone's
        own, union = sparse_density
        up = bits * own * (1 + 1 / DENSITY_BLOCK)
        wire = bits * union * (1 + 1 / DENSITY_BLOCK)
        cpu_worker = bits / k.scan_rate_bps + bits * (own + union) / 2 / k.sparse_rate_bps
    f = c.cpu_factor
    rate = k.python_switch_rate_bps if c.workers > MAX_NATIVE_WORKERS else k.switch_rate_bps
    terms = {"links": wire / (c.link_bps * k.switch_efficiency),
             "switch CPU": f * c.workers * up / rate, "worker CPU": f * cpu_worker}
    return f * k.switch_overhead_s + max(terms.values()), terms


def ring_messages(workers: int) -> int:
    """Messages a ring all-reduce sends in a row: 2(n-1) (reduce-scatter, all-gather)."""
    return 2 * (workers - 1)


def ring_bits(workers: int, nbytes: float) -> float:
    """Bits each worker of a ring all-reduce sends for ``nbytes``: 2(n-1)/n x 8 S."""
    return ring_allreduce_factor(workers) * 8 * nbytes


def ring_fixed_s(c: Cluster, k: Constants) -> float:
    """One ring all-reduce's fixed cost on ``c``: 2(n-1) messages in a row, alpha each."""
    return ring_messages(c.workers) * c.cpu_factor * k.ring_alpha_s


def _ring_time(nbytes: float, c: Cluster, k: Constants) -> tuple[float, dict[str, float]]:
    bits = ring_bits(c.workers, nbytes)
    terms = {"links": bits / (c.link_bps * k.ring_efficiency),
             "worker CPU": c.cpu_factor * bits / k.ring_rate_bps}
    return ring_fixed_s(c, k) + max(terms.values()), terms


def gather_fixed_s(c: Cluster, k: Constants) -> float:
    """One all-gather's fixed cost on ``c``: n-1 messages in a row, alpha each."""
    return (c.workers - 1) * c.cpu_factor * k.ring_alpha_s


def _gather_time(nbytes: float, c: Cluster, k: Constants) -> tuple[float, dict[str, float]]:
    links = (c.workers - 1) * 8 * nbytes / (c.link_bps * k.ring_efficiency)
    return gather_fixed_s(c, k) + links, {"links": links}


def _inner_fixed_s(cand: Candidate, c: Cluster, k: Constants) -> float:
    """The fixed cost of one collective of ``cand``'s inner exchange."""
    if not cand.summable:
        return gather_fixed_s(c, k)
    return c.cpu_factor * k.switch_overhead_s if cand.exchange == "switch" else ring_fixed_s(c, k)


def bucket_time(nbytes: float, cand: Candidate, profile: JobProfile, c: Cluster,
                k: Constants) -> tuple[float, dict[str, float]]:
    """Seconds to exchange one bucket of ``nbytes``, and the terms that make it."""
    ratio, compress_bps = cand.at(nbytes / 4)
    wire = nbytes * ratio
    extra = {}
    if cand.method is not None:  # a CPU cost: this machine's rate x the cluster's cpu_factor
        per_round = k.switch_round_s if cand.exchange == "switch" and cand.summable else \
            k.round_s
        extra["worker CPU"] = c.cpu_factor * (8 * nbytes / compress_bps
                                              + cand.rounds * per_round)
    if cand.method is not None and not cand.summable:
        t, terms = _gather_time(wire, c, k)
    elif cand.exchange == "ring":
        t, terms = _ring_time(wire, c, k)
    elif cand.exchange == "switch":
        t, terms = _switch_time(wire, c, k, None)
    elif cand.exchange == "sparse-switch":
        t, terms = _switch_time(wire, c, k, (profile.density, profile.result_density))
    elif cand.exchange == "auto":  # its rule, not the faster (the client counts the density)
        sparse = profile.result_density < auto_sparse_below(c.workers)
        t, terms = _switch_time(wire, c, k, (profile.density, profile.result_density)
                                if sparse else None)
    else:
        raise ConfigError(f"no cost model for exchange {cand.exchange!r}")
    t += (cand.rounds - 1) * _inner_fixed_s(cand, c, k)  # each further round pays it again
    for name, value in extra.items():
        terms = {**terms, name: terms.get(name, 0.0) + value}
    return t + sum(extra.values()), terms


def sync_costs(nbytes: float, sync: str, c: Cluster, k: Constants
               ) -> tuple[float, float, bool]:
    """(seconds on the links, CPU seconds per core here, whether the links overlap the
    compute) of one decentralized iteration exchanging a model of ``nbytes``.

    Hop sends the model to each out-neighbour before it computes and waits for the
    in-neighbours' after, with a token each way per neighbour (``HOP_DEGREE`` of each, on
    its ring graph): the links overlap the compute. Prague computes, asks the Group
    Generator for a group (one round trip) and all-reduces the model with it (a ring of
    ``PRAGUE_GROUP``): nothing overlaps. The CPU is gloo's copies and messages, priced
    with the ring's constants.
    """
    n = c.workers
    if sync == "hop":
        d = min(HOP_DEGREE, n - 1)
        bits = d * 8 * nbytes
        links = bits / (c.link_bps * k.ring_efficiency)
        return links, bits / k.ring_rate_bps + 4 * d * k.ring_alpha_s, True
    if sync == "prague":
        g = min(PRAGUE_GROUP, n)
        bits = 2 * (g - 1) / g * 8 * nbytes
        links = bits / (c.link_bps * k.ring_efficiency)
        return links, bits / k.ring_rate_bps + (2 * (g - 1) + 2) * k.ring_alpha_s, False
    raise ConfigError(f"no cost model for --sync {sync!r}")


def _exposed_links(links: float, overlaps: bool, busy_s: float) -> float:
    """What of a decentralized iteration's link time shows: hop's transfers hide behind
    the ``busy_s`` the worker computes meanwhile, prague's hide behind nothing."""
    return max(0.0, links - busy_s) if overlaps else links


def protocol_cpu_s(measured_s: float, profile: JobProfile, sync: str, c: Cluster,
                   k: Constants) -> float:
    """A decentralized protocol's CPU per iteration beyond compute (seconds per core here)
    from a measured homogeneous iteration on ``c``: the smaller of what the cores'
    throughput (every worker computing, ``compute_factor`` of them per core) and what one
    worker's path (compute, emulated compute, exposed links) leave of it, so that
    :func:`predict` gives ``measured_s`` back on ``c``."""
    w, emulated = profile.compute_s, profile.emulated_s
    links, _, overlaps = sync_costs(profile.gradient_bytes, sync, c, k)
    exposed = _exposed_links(links, overlaps, w + emulated)
    path = measured_s - w - emulated - exposed
    shared = measured_s / c.compute_factor - w if c.compute_factor > 1 else path
    return max(0.0, min(path, shared))


def _decentralized(profile: JobProfile, cand: Candidate, c: Cluster, k: Constants
                   ) -> Prediction:
    """One fast worker's iteration of hop or prague: its compute and emulated compute, its
    protocol's CPU (measured here, ``Candidate.iteration_cpu_s``, else modelled by
    :func:`sync_costs`) and its exposed links; no buckets (models are exchanged once the
    step is computed). Where the workers share this machine's cores
    (``compute_factor > 1``) the iteration is the longer of one worker's path at full
    speed and the cores' throughput, ``compute_factor`` x (compute + protocol CPU)."""
    links, modelled, overlaps = sync_costs(profile.gradient_bytes, cand.sync, c, k)
    cpu = modelled if cand.iteration_cpu_s is None else cand.iteration_cpu_s
    w, emulated, f = profile.compute_s, profile.emulated_s, c.compute_factor
    if f > 1:
        exposed = _exposed_links(links, overlaps, w + emulated)
        iteration = max(w + emulated + cpu + exposed, f * (w + cpu))
        compute = max(w + emulated, f * w)
    else:
        compute = w * f + emulated
        exposed = _exposed_links(links, overlaps, compute)
        iteration = compute + cpu * c.cpu_factor + exposed
    beyond = iteration - compute
    terms = {"links": links, "switch CPU": 0.0, "worker CPU": cpu * max(f, c.cpu_factor)}
    limiter = "compute" if beyond <= 0.1 * iteration else max(terms, key=lambda t: terms[t])
    return Prediction(cand.label, iteration, compute, beyond, beyond, limiter, terms)


def predict(profile: JobProfile, cand: Candidate, c: Cluster, k: Constants) -> Prediction:
    """One iteration of ``profile`` on ``c`` through ``cand``."""
    if cand.sync != "bsp":
        return _decentralized(profile, cand, c, k)
    f = c.compute_factor
    fwd = profile.forward_s * f + profile.emulated_s + c.delay_s
    bwd = profile.backward_s * f
    opt = (profile.optimizer_s + profile.overhead_s) * f  # after the last bucket
    compute = fwd + bwd + opt
    times, totals = [], {"links": 0.0, "switch CPU": 0.0, "worker CPU": 0.0}
    for b in profile.buckets:
        t, terms = bucket_time(b.bytes, cand, profile, c, k)
        times.append(t)
        for name, value in terms.items():
            totals[name] += value
    # each bucket starts at max(its ready time, the previous end), as adaptive prices too
    done = finish_time([fwd + b.ready_s * f for b in profile.buckets], times)
    iteration = max(fwd + bwd, done) + opt
    exposed = iteration - compute
    limiter = "compute" if exposed <= 0.1 * iteration else \
        max(totals, key=lambda name: totals[name])
    return Prediction(cand.label, iteration, compute, sum(times), max(exposed, 0.0), limiter,
                      totals)
