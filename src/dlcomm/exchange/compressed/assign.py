"""The adaptive policy's choice, pure: buckets run in order, the single change that helps
most while it clearly helps, and the spacing of probes (``dlcomm.exchange.compressed
.adaptive``, steps 3, 4 and 7).

:func:`dlcomm.timeline.finish_time` is the pipeline both the adaptive policy and ``dlcomm
advise`` (:mod:`dlcomm.advise.cost`) price an iteration's communication with: each bucket
starts when it is handed over and the previous one is done.
"""

from __future__ import annotations

import math

from dlcomm.timeline import finish_time

__all__ = ["LOSSINESS", "simulate_exposed", "greedy_assignment", "probe_spacing", "ema",
           "PROBE_SHARE", "PROBE_STRETCH"]

LOSSINESS = ("none", "fp16", "powersgd", "topk")
PROBE_SHARE = 0.02  # uncompressed probes may cost this share of the time, at most ...
PROBE_STRETCH = 4   # ... by spacing them out to this many probe periods


def simulate_exposed(offsets: list[float], costs: list[float]) -> float:
    """Time from the last hand-over until the last bucket is done (buckets run in order)."""
    return max(0.0, finish_time(offsets, costs) - max(offsets, default=0.0))


def greedy_assignment(offsets: list[float], cost: list[dict[str, float]],
                      rel: float = 0.05, abs_s: float = 2e-4) -> list[str]:
    """Step 4: from all-none, apply the best single change while it clearly helps."""
    choice = ["none"] * len(offsets)
    best = simulate_exposed(offsets, [c["none"] for c in cost])
    while True:
        options = []
        for b, c in enumerate(cost):
            for m in LOSSINESS[LOSSINESS.index(choice[b]) + 1:]:
                if m in c:
                    trial = choice[:b] + [m] + choice[b + 1:]
                    options.append((simulate_exposed(offsets, [cost[i][trial[i]]
                                                               for i in range(len(cost))]),
                                    LOSSINESS.index(m), b, m))
        if not options:
            return choice
        exposed, _, b, m = min(options)
        if exposed >= best - max(rel * best, abs_s):
            return choice
        choice[b], best = m, exposed


def probe_spacing(extra_s: float, iteration_s: float, probe: int) -> int:
    """Step 7's spacing: a probe costs ``extra_s`` more than a compressed iteration of
    ``iteration_s``; probes come every ``probe`` iterations, or further apart (up to
    ``PROBE_STRETCH`` x) so that they cost at most ``PROBE_SHARE`` of the time."""
    if probe <= 0 or extra_s <= 0:
        return max(probe, 1)
    if iteration_s <= 0:
        return PROBE_STRETCH * probe
    wanted = math.ceil(extra_s / (PROBE_SHARE * iteration_s))
    return int(min(PROBE_STRETCH * probe, max(probe, wanted)))


def ema(store: dict[str, float], key: str, value: float, weight: float = 0.5) -> None:
    """Exponential moving average in place (the first value is taken as is)."""
    store[key] = value if key not in store else (1 - weight) * store[key] + weight * value
