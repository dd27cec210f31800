"""``dlcomm advise``: rank the candidates for one job, sweep the link rate, assemble JSON.

Straggler profiles (``--straggler RANK:FACTOR``) add bsp against hop and prague. A worker
FACTOR times slower sleeps longer before its backward, as the trainer's straggler does
(``dlcomm.train.hetero``): FACTOR x the emulated compute instead of 1 x (``--compute-ms``),
or, without emulated compute, (FACTOR - 1) x 3 x its forward. bsp waits for it every step;
where the workers share this machine's cores, the others' compute fills that sleep, so
bsp pays only what the straggler's path (its forward, sleep and backward at full speed:
the workers leave an all-reduce one by one and their forwards barely overlap) takes
beyond the others' (their compute at the shared speed and their sleep). Hop (the slow
worker skips iterations) and Prague (groups of ready workers) let the others run at their
own pace (:func:`dlcomm.advise.cost.predict`); while the straggler sleeps, its share of
the cores goes to the others: they are priced as n - 1 + 1/FACTOR workers sharing the
cores instead of n. The model prices a step, not the staleness a step costs in accuracy.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any

from dlcomm.advise.cost import (
    Candidate,
    Cluster,
    Constants,
    Prediction,
    bucket_time,
    predict,
    ring_fixed_s,
)
from dlcomm.advise.profile import JobProfile
from dlcomm.results import new_result

__all__ = ["rank", "bounded_by_cores", "sweep", "advise_result", "KNOWN_ERROR",
           "straggler_clusters", "machine_factor", "known_error", "ring_fixed_share"]

KNOWN_ERROR = 0.10  # relative error of predicted iteration times (docs/advise.md)
# The verified jobs whose workers shared this machine's cores and whose ring was mostly
# fixed costs missed by up to 28% (digits-cnn at 10 Gbit/s, docs/advise.md): inside
# training the ring's hops wait longer than between the barriers its constants came from.
SHARED_RING_ERROR = 0.30
FIXED_BOUND = 0.5  # the ring's fixed costs above this share of its time: latency-bound
SWEEP_BPS = [10 ** (7 + i / 4) for i in range(17)]  # 10 Mbit/s .. 100 Gbit/s
PAYS_FROM = 1.05   # a candidate "pays" at the rates where it is 5% faster than the ring


def straggler_clusters(profile: JobProfile, cluster: Cluster,
                       rank_factor: tuple[int, float] | None) -> tuple[Cluster, Cluster]:
    """(the cluster bsp runs on, the one the decentralized protocols' fast workers see)."""
    if rank_factor is None:
        return cluster, cluster
    n, x, f = cluster.workers, rank_factor[1], cluster.compute_factor
    fwd, bwd, emulated = profile.forward_s, profile.backward_s, profile.emulated_s
    sleep = x * emulated if emulated > 0 else (x - 1) * 3 * fwd
    straggler = fwd + sleep + bwd               # at full speed while the others wait
    others = (fwd + bwd) * f + emulated
    bsp = replace(cluster, delay_s=max(0.0, straggler - others))
    if f <= 1:
        return bsp, cluster
    share = (n - 1 + 1 / x) / n  # the straggler computes 1/x of its time
    return bsp, replace(cluster, compute_factor=max(1.0, f * share),
                        cpu_factor=cluster.cpu_factor * share)


def machine_factor(workers: int, cores: int | None = None) -> float:
    """How much slower each worker computes when ``workers`` share this machine's cores
    (verification here): workers x threads / cores, threads = cores // workers (>= 1)."""
    cores = cores or os.cpu_count() or 1
    threads = max(1, cores // workers)
    return max(1.0, workers * threads / cores)


def bounded_by_cores(pred: Prediction, floor_s: float | None) -> Prediction:
    """``pred``, or the candidate's step measured where the links cost nothing
    (``Candidate.floor_s``: a short run on loopback, its workers sharing this machine's
    cores) when that is longer: no link rate makes a step on those cores shorter than
    the CPU it spends there. The exposed communication stays the model's: the rest of the
    step is the cores' contention, not the network (pure)."""
    if floor_s is None or floor_s <= pred.iteration_s:
        return pred
    return replace(pred, iteration_s=floor_s, limiter="cores",
                   terms={**pred.terms, "cores": floor_s})


def rank(profile: JobProfile, cands: list[Candidate], cluster: Cluster, k: Constants,
         straggler: tuple[int, float] | None = None) -> list[Prediction]:
    """Predictions for every candidate, fastest first."""
    bsp, decentralized = straggler_clusters(profile, cluster, straggler)
    out = []
    for cand in cands:
        pred = predict(profile, cand, bsp if cand.sync == "bsp" else decentralized, k)
        out.append(bounded_by_cores(pred, cand.floor_s))
    return sorted(out, key=lambda p: p.iteration_s)


def sweep(profile: JobProfile, cands: list[Candidate], cluster: Cluster, k: Constants,
          straggler: tuple[int, float] | None = None) -> dict[str, Any]:
    """Predicted speedup over the ring per candidate at link rates of 10 Mbit/s-100 Gbit/s,
    and the range of rates [lowest, highest] at which each pays (None if it never does)."""
    speedups: dict[str, list[float]] = {}
    for bps in SWEEP_BPS:
        preds = {p.candidate: p for p in rank(profile, cands, replace(cluster, link_bps=bps),
                                              k, straggler)}
        ring = preds["ring"].iteration_s
        for label, p in preds.items():
            speedups.setdefault(label, []).append(ring / p.iteration_s)
    pays: dict[str, list[float] | None] = {}
    for label, values in speedups.items():
        paying = [bps for bps, s in zip(SWEEP_BPS, values) if s >= PAYS_FROM]
        pays[label] = [paying[0], paying[-1]] if paying else None
    return {"link_bps": SWEEP_BPS, "speedup_over_ring": speedups, "pays_bps": pays}


def ring_fixed_share(profile: JobProfile, cluster: Cluster, k: Constants) -> float:
    """The share of the ring's exchange time that is its fixed costs, 2(n-1) messages per
    bucket, rather than bytes (pure)."""
    ring = Candidate("ring")
    total = sum(bucket_time(b.bytes, ring, profile, cluster, k)[0] for b in profile.buckets)
    return len(profile.buckets) * ring_fixed_s(cluster, k) / total if total > 0 else 0.0


def known_error(profile: JobProfile, cluster: Cluster, k: Constants,
                fitted: float | None = None, bounded: bool = False) -> tuple[float, str]:
    """The error the confidence allows the predictions, and why (pure): the model's on its
    verified jobs; a measured calibration's worst fit where larger; and where the workers
    share this machine's cores and the ring is latency-bound, what such jobs missed by,
    unless the ring's step on those cores was measured and bounds it (``bounded``: its
    waits inside training are then in its loopback step, :func:`bounded_by_cores`)."""
    error, why = KNOWN_ERROR, "the model's error on its verified jobs"
    if fitted is not None and fitted > error:
        error, why = fitted, "the calibration's worst fit"
    if cluster.compute_factor > 1 and not bounded and SHARED_RING_ERROR > error and \
            ring_fixed_share(profile, cluster, k) > FIXED_BOUND:
        error, why = SHARED_RING_ERROR, ("workers sharing this machine's cores, a ring of "
                                         "mostly fixed costs")
    return error, why


def _confidence(preds: list[Prediction], error: tuple[float, str]) -> dict[str, Any]:
    best, second = preds[0], preds[1] if len(preds) > 1 else preds[0]
    margin = second.iteration_s / best.iteration_s - 1
    known, why = error
    level = "high" if margin > 2 * known else "medium" if margin > known else "low"
    return {"level": level, "margin_over_next": margin, "known_error": known,
            "known_error_from": why,
            "meaning": f"the top candidate is {margin:.0%} faster than the next; predictions "
                       f"are known to be within about {known:.0%} ({why})"}


def advise_result(profile: JobProfile, cands: list[Candidate], cluster: Cluster,
                  k: Constants, job: dict[str, Any],
                  straggler: tuple[int, float] | None = None,
                  fit_error: float | None = None) -> dict[str, Any]:
    """The ``advise`` JSON result (no verification yet); ``fit_error``, a measured
    calibration's, widens the confidence's known error when it is larger
    (:func:`known_error`)."""
    preds = rank(profile, cands, cluster, k, straggler)
    ring_p = next(p for p in preds if p.candidate == "ring")
    ring, ring_bounded = ring_p.iteration_s, ring_p.limiter == "cores"
    rows = [{"candidate": p.candidate, "iteration_s": p.iteration_s,
             "speedup_over_ring": ring / p.iteration_s, "compute_s": p.compute_s,
             "comm_s": p.comm_s, "exposed_share": p.exposed_share, "limiter": p.limiter,
             "terms_s": p.terms} for p in preds]
    result = new_result("advise", {**job, "constants": k.to_dict(),
                                   "cluster": {"workers": cluster.workers,
                                               "link_bps": cluster.link_bps,
                                               "topology": cluster.topology,
                                               "compute_factor": cluster.compute_factor,
                                               "cpu_factor": cluster.cpu_factor}})
    result["profile"] = profile.to_dict()
    result["candidates"] = [{"candidate": c.label, "exchange": c.exchange,
                             "method": c.method, "ratio": c.ratio,
                             "compress_gbps": None if math.isinf(c.compress_bps)
                             else c.compress_bps / 1e9, "sync": c.sync,
                             "iteration_cpu_s": c.iteration_cpu_s, "floor_s": c.floor_s,
                             "sizes": [{"elements": n, "ratio": r, "compress_gbps": b / 1e9}
                                       for n, r, b in c.sizes]} for c in cands]
    result["predictions"] = rows
    result["sweep"] = sweep(profile, cands, cluster, k, straggler)
    result["summary"] = {"recommendation": rows[0]["candidate"],
                         "predicted_speedup_over_ring": rows[0]["speedup_over_ring"],
                         "confidence": _confidence(
                             preds, known_error(profile, cluster, k, fit_error,
                                                bounded=ring_bounded))}
    return result
