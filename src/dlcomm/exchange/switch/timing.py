"""The retransmission timer of the switch's clients: its settings and the round-trip
estimate (window.py's AllreduceOp and the native client, csrc/client.c, use the same)."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

__all__ = ["Timing", "RttEstimator"]


@dataclass(frozen=True)
class Timing:
    initial_timeout_s: float = 0.2     # before any round-trip was measured
    min_timeout_s: float = 0.01
    max_timeout_s: float = 2.0
    deadline_s: float = 30.0           # no progress for this long: the op fails


class RttEstimator:
    """Retransmission timeout: a multiple of the smallest recent round trip, and at least
    twice the median one.

    A round's round trip includes waiting for the slowest worker, and under loss for the
    other workers' recoveries, so a mean (RFC 6298's srtt) inflates the timeout, which slows
    recovery, which inflates the mean. The minimum over a window of recent rounds measures
    the network and the switch alone. But when workers are slower than the network (CPU-bound
    rounds, a busy switch), most rounds wait for a straggler several times that long, and
    probing every one of them loads the switch that everybody waits for: twice the median
    keeps those probes rare. A probed round gives no sample (Karn): not only the worker's
    own losses, but its peers' too would inflate the median (the round waits for their
    recoveries; at 20% loss and 6 workers almost every round does, and the timeout grew
    until no progress was made for 30 s). The price: when rounds slow down all at once,
    the median lags until unprobed rounds show it; the backoff below bounds the probes
    meanwhile.
    """

    WINDOW = 128
    FACTOR = 4.0
    MEDIAN_FACTOR = 2.0
    REFRESH = 16  # samples between recomputations of the median

    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.samples: deque[float] = deque(maxlen=self.WINDOW)
        self.srtt: float | None = None  # smoothed round trip, for waiting on a sent result
        self._median = 0.0
        self._fresh = 0

    def sample(self, rtt: float) -> None:
        self.samples.append(rtt)
        self.srtt = rtt if self.srtt is None else 0.875 * self.srtt + 0.125 * rtt
        self._fresh += 1
        if self._fresh >= self.REFRESH or len(self.samples) < self.REFRESH:
            self._fresh = 0
            self._median = statistics.median(self.samples)  # numpy's costs 60x on 16-128

    def timeout(self, backoff: int = 0) -> float:
        t = self.timing
        base = max(self.FACTOR * min(self.samples), self.MEDIAN_FACTOR * self._median) \
            if self.samples else t.initial_timeout_s
        return float(min(t.max_timeout_s, max(t.min_timeout_s, base) * 2.0 ** backoff))
