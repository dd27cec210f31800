"""``adaptive``: choose the compression of every bucket from the measured network and overlap.

Candidates, from lossless to most lossy: ``none``, ``fp16``, ``powersgd`` (rank r) and, when
asked for (``candidates=...+topk``), ``topk`` (ratio k), all with error feedback (residual
memory unless ``--memory`` names another). Not top-k by default: the model prices a step,
and top-k's cheap steps cost more of them (digits-cnn to 95%: twice as many, docs/
compression.md). The model (GRACE and its successors, docs/references.md: compression
pays only where communication is exposed and the network slow):

1. measure, per collective, (bytes this worker sent, seconds); the latency alpha is the
   median time of recent tiny collectives (< 4 KiB, including the small all-reduce of
   step 6), the bandwidth B the median of bytes / (seconds - alpha) over the last 5 large
   (>= 64 KiB) uncompressed float32 ones of the last 3 probe periods (a transfer no slower
   than alpha means the network is not what limits it: B is then taken as 20 x bytes /
   seconds); compressed transfers do not count, they feed step 2's factors instead;
2. measure, per bucket, when it was handed over (offset s_b after the first bucket), and per
   bucket and method the compression + decompression seconds C and the bytes sent W; a
   method's cost for a bucket is T = C + f_m (rounds * alpha + W / B), where f_m is the
   ratio of the method's measured to its modelled collective time (gloo sums float16 on
   CPUs far slower than float32, an all-gather costs more than its bytes, a CPU-bound
   network has a high fixed cost per collective; only measurement tells). All three come
   first from one trial per candidate, when a bucket is first seen: the method compresses
   random data of the bucket's size and exchanges it through the real exchange, every
   worker alike (a few collectives, once, instead of iterations spent on a method that
   does not pay); then from real calls;
3. the exchange thread runs buckets in order, so an assignment's *exposed* time (what
   backward waits after its last bucket; the trainer's comm wait) is simulated as
   t_b = max(s_b, t_(b-1)) + T_b, exposed = t_last - s_last (:mod:`.assign`: the
   pipeline ``dlcomm advise`` prices iterations with); communication that fits before
   the last hand-over is hidden behind compute and gains nothing from compression;
4. greedy from all-``none``: repeatedly apply the single (bucket, more lossy method) change
   that lowers the exposed time most, while it lowers it by more than 5% and 0.2 ms;
5. hysteresis: switch to more compression only if the proposal beats the current
   assignment's predicted exposed time by more than ``margin`` (10%) of the iteration time
   (measured between the first hand-overs of consecutive iterations) and ``min_gain_ms``,
   and was proposed at two decisions in a row, or at once when it is predicted to halve
   the exposed time (the first decision comes right after the trials: on a slow network
   every uncompressed iteration is the most expensive kind); back to less compression:
   when it is predicted no slower, twice in a row; then verify by measurement: if over the next
   ``every`` iterations the median measured exposed time is not below the median before the
   switch by margin / 2 (back: not above it by margin / 2), revert, and do not try those
   (bucket, method) pairs for 4 probe periods; while anything is compressed, compare with
   the uncompressed probes of step 7 as a control group: if the compressed iterations'
   median exposed time is not below the probes' by margin / 2, go back to ``none``;
6. every worker averages its measurements with the others (one small all-reduce) before
   deciding, so all take the same decision; decisions every ``every`` iterations, and
   while a decision finds nothing to change the interval doubles up to ``probe``. The
   all-reduce is started at the decision's iteration, runs beside that iteration's
   gradients and is collected at the next one, where the decision takes effect (a
   blocking all-reduce per decision was most of this layer's cost on a fast network);
7. every ``probe`` iterations one iteration runs uncompressed to re-measure the bandwidth
   (compressed payloads are too small to tell a link's rate); once compressing, probes are
   priced by the model (a probe costs the predicted uncompressed minus compressed exposed
   time) and spaced out, up to 4 probe periods, so that they cost at most 2% of the time.

On a fast network W / B is small next to C, step 4 finds no gain and every bucket stays
``none``. The choices, measurements and decisions of every step are in the exchange's stats.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from dlcomm.compress.base import Compressor
from dlcomm.compress.fp16 import HalfCompressor
from dlcomm.compress.none import NoCompression
from dlcomm.compress.powersgd import PowerSGD
from dlcomm.compress.topk import TopK
from dlcomm.exchange.compressed.assign import (
    LOSSINESS,
    ema,
    greedy_assignment,
    probe_spacing,
    simulate_exposed,
)
from dlcomm.exchange.compressed.policy import STABLE_ITERATION, CallRecord, Policy
from dlcomm.volume import ring_allreduce_factor

__all__ = ["AdaptivePolicy", "simulate_exposed", "greedy_assignment"]

Agree = Callable[[list[float]], Callable[[], list[float]]]
"""Start averaging these numbers over the workers; the returned call waits for the result."""

TINY_BYTES = 4 * 1024
LARGE_BYTES = 64 * 1024
DEFAULT_ALPHA_S = 2e-4
MAX_STEPS_LOGGED = 20_000
DEFAULT_CANDIDATES = ("none", "fp16", "powersgd")  # topk on request (module docstring)
DECISIVE = 0.5      # a proposal predicted to halve the exposed time is taken at once


class AdaptivePolicy(Policy):
    """Per-bucket choice among none / fp16 / powersgd (/ topk) (module docstring)."""

    def __init__(self, world: int, agree: Agree,
                 every: int = 5, probe: int = 20, margin: float = 0.1, min_gain_ms: float = 1.0,
                 ratio: float = 0.01, rank: int = 4,
                 candidates: tuple[str, ...] = DEFAULT_CANDIDATES) -> None:
        self.world, self.agree = world, agree
        self.every, self.probe, self.margin = every, probe, margin
        self.min_gain_s = min_gain_ms / 1e3
        self.ratio, self.rank = ratio, rank
        self.methods = {m: c for m, c in self._fresh().items() if m in candidates or m == "none"}
        self.assignment: dict[str, str] = {}
        self.proposal: dict[str, str] | None = None
        self.order: list[str] = []            # bucket names in hand-over order
        self.offsets: dict[str, float] = {}   # s_b (EMA)
        self.compute: dict[str, dict[str, float]] = {}
        self.wire: dict[str, dict[str, float]] = {}
        self.rounds: dict[str, float] = {"none": 1, "fp16": 1, "powersgd": 2, "topk": 1}
        self.factor: dict[str, float] = {m: 1.0 for m in LOSSINESS}
        self.timed_methods: set[str] = set()   # whose factor a trial has set
        self.iteration_s = 0.0
        self.durations: list[float] = []
        self._first_submit = 0.0
        self.samples: list[tuple[int, int, float]] = []   # (iteration, bytes, seconds)
        self.latencies: list[float] = []                    # tiny collectives (seconds)
        self.alpha, self.bandwidth = DEFAULT_ALPHA_S, math.inf
        self.current: list[CallRecord] = []
        self.iteration = -1
        self.steps: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self.exposures: list[tuple[int, float, bool]] = []  # (iteration, exposed s, probe)
        self.trial: dict[str, Any] | None = None            # a switch being verified
        self.banned: dict[tuple[str, str], int] = {}        # (bucket, method) -> until
        self.switched_at = 0
        self.gap = every                 # iterations between decisions: doubles while stable
        self.probe_gap = probe           # iterations between probes: priced (step 7)
        self.probes: set[int] = set()    # the iterations that were probes
        self.next_probe = STABLE_ITERATION + probe
        self.last_decided = -1
        self.pending: dict[str, Any] | None = None  # a decision whose all-reduce is running

    # -- the Policy interface ---------------------------------------------------------------

    def compressors(self) -> list[Compressor]:
        return list(self.methods.values())

    def choose(self, name: str, numel: int, iteration: int) -> Compressor:
        if iteration != self.iteration:
            self._next_iteration(iteration)
        if self._probing(iteration) or self.world == 1:
            return self.methods["none"]
        return self.methods[self.assignment.get(name, "none")]

    def trials(self, name: str, numel: int, iteration: int) -> list[Compressor]:
        """Step 2's trial: the first time a bucket is seen (once its key is final), every
        candidate runs once on random data of its size, through the real exchange."""
        if name in self.compute or iteration < STABLE_ITERATION:
            return []
        n = self.world
        self.compute[name] = {"none": 0.0}
        self.wire[name] = {"none": ring_allreduce_factor(n) * numel * 4}
        if n == 1:
            return []
        if not self.latencies:  # one tiny blocking all-reduce first: the latency alpha
            t0 = time.perf_counter()
            self.agree([0.0])()
            self.latencies.append(time.perf_counter() - t0)
        self._estimate_network()
        return [c for m, c in self._fresh().items() if m != "none" and m in self.methods]

    def timed(self, record: CallRecord) -> None:
        m = record.method
        self.compute[record.name][m] = record.compute_s
        self.wire[record.name][m] = record.wire_bytes
        self.rounds[m] = len(record.collectives) or self.rounds[m]
        modelled = self.rounds[m] * self.alpha + record.wire_bytes / self.bandwidth
        if modelled > 0:
            ratio = min(20.0, max(0.25, record.comm_s / modelled))
            if m in self.timed_methods:
                ema(self.factor, m, ratio, weight=0.3)
            else:
                self.factor[m] = ratio
                self.timed_methods.add(m)

    def observe(self, record: CallRecord) -> None:
        self.current.append(record)
        for nbytes, seconds in record.collectives:
            if nbytes < TINY_BYTES:
                self.latencies.append(seconds)
            elif nbytes >= LARGE_BYTES and record.method == "none":
                self.samples.append((record.iteration, nbytes, seconds))
        del self.samples[:-64]
        del self.latencies[:-16]
        if record.iteration >= STABLE_ITERATION:
            m = record.method
            ema(self.compute.setdefault(record.name, {}), m, record.compute_s)
            ema(self.wire.setdefault(record.name, {}), m, record.wire_bytes)
            self.rounds[m] = len(record.collectives) or self.rounds[m]
            modelled = self.rounds[m] * self.alpha + record.wire_bytes / self.bandwidth
            if m != "none" and modelled > 0 and not self._probing(record.iteration):
                ratio = min(20.0, max(0.25, record.comm_s / modelled))
                ema(self.factor, m, ratio, weight=0.3)

    def stats(self) -> dict[str, Any]:
        return {"adaptive": {"candidates": list(self.methods), "every": self.every,
                             "probe": self.probe, "margin": self.margin,
                             "assignment": dict(self.assignment),
                             "steps": self.steps, "decisions": self.decisions}}

    # -- per iteration ------------------------------------------------------------------------

    def _probing(self, iteration: int) -> bool:
        return iteration <= STABLE_ITERATION or iteration in self.probes

    def _set_probe_gap(self, gap: int) -> None:
        """A new spacing, counted from the last probe (no probes back to back)."""
        self.probe_gap = gap
        self.next_probe = max(self.probes, default=STABLE_ITERATION) + gap

    def _next_iteration(self, iteration: int) -> None:
        if self.current:
            self._finish(self.current)
        self.current = []
        self.iteration = iteration
        if self.probe > 0 and iteration > STABLE_ITERATION and iteration >= self.next_probe:
            self.probes.add(iteration)
            self.next_probe = iteration + self.probe_gap
        compressing = any(m != "none" for m in self.assignment.values())
        due = iteration > STABLE_ITERATION and (
            self.last_decided < 0  # the first: as soon as the trials have run
            or iteration - max(self.last_decided, STABLE_ITERATION) >= self.gap
            or (compressing and self._probing(iteration - 1)))
        if self.pending is not None:
            self._conclude(iteration, self.pending)
        if due and self.order and self.world > 1:
            self._decide(iteration)

    def _finish(self, records: list[CallRecord]) -> None:
        first = min(r.submitted for r in records)
        last = max(r.submitted for r in records)
        exposed = max(0.0, max(r.finished for r in records) - last)
        busy = sum(r.finished - r.started for r in records)
        if self._first_submit:  # median: evaluations make rare long gaps
            self.durations = (self.durations + [first - self._first_submit])[-9:]
            self.iteration_s = statistics.median(self.durations)
        self._first_submit = first
        if records[0].iteration >= STABLE_ITERATION:
            self.order = [r.name for r in records]
            for r in records:
                ema(self.offsets, r.name, r.submitted - first)
        self._estimate_network()
        it = records[0].iteration
        self.exposures.append((it, exposed, self._probing(it)))
        del self.exposures[:-4 * max(self.probe_gap, self.every, 8)]
        if len(self.steps) < MAX_STEPS_LOGGED:
            self.steps.append({
                "iteration": records[0].iteration, "probe": self._probing(records[0].iteration),
                "methods": {r.name: r.method for r in records},
                "exposed_s": exposed, "busy_s": busy,
                "hidden_share": 1 - exposed / busy if busy > 0 else None,
                "bandwidth_Bps": self.bandwidth if math.isfinite(self.bandwidth) else None,
                "latency_s": self.alpha})

    def _estimate_network(self) -> None:
        if self.latencies:
            self.alpha = statistics.median(self.latencies)
        oldest = self.iteration - 3 * max(self.probe_gap, self.every)
        recent = [(b, s) for i, b, s in self.samples if i >= oldest][-5:]
        if recent:
            self.bandwidth = statistics.median(b / max(s - self.alpha, 0.05 * s)
                                               for b, s in recent)

    def _fresh(self) -> dict[str, Compressor]:
        return {"none": NoCompression(), "fp16": HalfCompressor(torch.float16),
                "powersgd": PowerSGD(self.rank, start=0), "topk": TopK(self.ratio)}

    def _revert(self, iteration: int, previous: dict[str, str], why: str,
                measured: dict[str, float]) -> None:
        """Go back to ``previous`` and ban the methods given up for 4 probe periods."""
        for name, method in self.assignment.items():
            if method != previous.get(name, "none"):
                self.banned[(name, method)] = iteration + 4 * max(self.probe, self.every)
        self.assignment = dict(previous)
        self.proposal = self.trial = None
        self._set_probe_gap(self.probe)
        self.decisions.append({"iteration": iteration, "reverted": True, "why": why,
                               "measured_exposed_s": measured})

    def _probe_comparison(self, iteration: int) -> tuple[float, float]:
        """(median exposed time of the recent uncompressed probes, of the compressed
        iterations since then), or (-1, -1) when there is too little to compare."""
        if not self.probe or all(m == "none" for m in self.assignment.values()):
            return -1.0, -1.0
        since = self.switched_at
        probes = [e for i, e, probe in self.exposures if probe and i > max(
            STABLE_ITERATION, since)]  # (probes before the switch saw another network)
        treated = [e for i, e, probe in self.exposures if not probe and i > since]
        if len(probes) < 2 or len(treated) < self.every:
            return -1.0, -1.0
        return statistics.median(probes[-3:]), statistics.median(treated[-3 * self.every:])

    def _measured(self, first: int, last: int) -> float:
        """Median exposed time of the non-probe iterations in [first, last) (-1: none)."""
        values = [e for i, e, probe in self.exposures if first <= i < last and not probe]
        return statistics.median(values) if values else -1.0

    def _decide(self, iteration: int) -> None:
        """Start a decision: average this worker's measurements with the others'."""
        self.last_decided = iteration
        names = self.order
        if not self.latencies:  # one tiny blocking all-reduce first: the latency alpha
            t0 = time.perf_counter()
            self.agree([0.0])()
            self.latencies.append(time.perf_counter() - t0)
        trial = self.trial or {}
        verify = bool(trial) and iteration >= trial["since"] + self.every
        control, treated = self._probe_comparison(iteration)
        mine = [self.alpha, 1 / self.bandwidth if math.isfinite(self.bandwidth) else 0.0,
                trial["before"] if verify else -1.0,
                self._measured(trial["since"], iteration) if verify else -1.0,
                self.iteration_s, control, treated]
        mine += [self.factor[m] for m in LOSSINESS]
        mine += [self.offsets.get(n, 0.0) for n in names]
        mine += [self.compute.get(n, {}).get(m, -1.0) for n in names for m in LOSSINESS]
        mine += [self.wire.get(n, {}).get(m, -1.0) for n in names for m in LOSSINESS]
        self.pending = {"names": list(names), "trial": trial, "verify": verify,
                        "gap": self.gap, "collect": self.agree(mine)}

    def _conclude(self, iteration: int, pending: dict[str, Any]) -> None:
        """Take the decision started one iteration ago, from the numbers every worker has."""
        self.pending = None
        names, trial, verify = pending["names"], pending["trial"], pending["verify"]
        stable_gap, self.gap = pending["gap"], self.every  # base rate unless nothing changes
        agreed = pending["collect"]()               # the same numbers on every worker
        alpha, inv_b, before, after, iteration_s, control, treated = agreed[:7]
        factor = dict(zip(LOSSINESS, agreed[7:11]))
        agreed = agreed[11:]
        if control > 0 and treated > control * (1 - self.margin / 2):
            self._revert(iteration, {}, "uncompressed probes were as fast",
                         {"probes": control, "compressed": treated})
            return
        if verify and trial is not None:            # step 5: did the switch pay, measured?
            self.trial = None
            slack = 1 + self.margin / 2 if trial["relaxing"] else 1 - self.margin / 2
            if before > 0 and after > 0 and after > before * slack:
                self._revert(iteration, trial["previous"], "the switch did not pay",
                             {"before": before, "after": after})
                return
        if inv_b <= 0:
            return
        k = len(names)
        offsets = agreed[:k]
        comp = agreed[k:5 * k]
        wire = agreed[5 * k:9 * k]
        cost = []
        for b in range(k):
            row = {}
            for j, m in enumerate(LOSSINESS):
                c, w = comp[4 * b + j], wire[4 * b + j]
                banned = self.banned.get((names[b], m), -1) > iteration
                if c >= 0 and w >= 0 and (not banned or m == "none"):
                    row[m] = c + factor[m] * (self.rounds[m] * alpha + w * inv_b)
            cost.append(row)
        proposal = greedy_assignment(offsets, cost)
        current = [self.assignment.get(n, "none") for n in names]
        now_s = simulate_exposed(offsets, [cost[b].get(current[b], math.inf)
                                           for b in range(k)])
        new_s = simulate_exposed(offsets, [cost[b][proposal[b]] for b in range(k)])
        relaxing = all(LOSSINESS.index(p) <= LOSSINESS.index(c)
                       for p, c in zip(proposal, current)) and proposal != current
        if relaxing:   # less compression needs only to be no slower
            better = new_s <= now_s
        else:
            better = not math.isfinite(now_s) or new_s < now_s - max(
                self.margin * max(iteration_s, now_s), self.min_gain_s)
        chosen = dict(zip(names, proposal))
        decisive = better and not relaxing and new_s < DECISIVE * now_s
        switch = better and (self.proposal == chosen or decisive) and proposal != current
        if not better and self.trial is None:  # nothing to change: decide less often (each
            # decision is an all-reduce), at least once per probe period
            self.gap = min(2 * stable_gap, max(self.probe, self.every))
        self.proposal = chosen if better else None
        if switch:
            self.switched_at = iteration
            self.trial = {"since": iteration, "previous": dict(self.assignment), "relaxing":
                          relaxing, "before": self._measured(iteration - 2 * self.every,
                                                             iteration)}
            self.assignment = chosen
        held = [cost[b].get(self.assignment.get(n, "none"), math.inf) for b, n in enumerate(names)]
        held_s, none_s = simulate_exposed(offsets, held), simulate_exposed(
            offsets, [cost[b]["none"] for b in range(k)])
        if math.isfinite(held_s):  # priced against the iteration as it will run
            saved = now_s - held_s if switch and math.isfinite(now_s) else 0.0
            gap = probe_spacing(none_s - held_s, max(iteration_s - saved, held_s, 1e-6),
                                self.probe)
            if gap != self.probe_gap:
                self._set_probe_gap(gap)
        self.decisions.append({"iteration": iteration, "proposal": chosen,
                               "predicted_exposed_s": {"current": now_s, "proposal": new_s},
                               "bandwidth_Bps": 1 / inv_b, "latency_s": alpha,
                               "iteration_s": iteration_s, "factors": factor,
                               "switched": switch, "probe_gap": self.probe_gap})
