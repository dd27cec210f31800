"""Heterogeneity injection: emulated compute time per step, and stragglers.

``--compute-ms C`` makes every step cost C milliseconds of (emulated) compute on top of the
real one, so that 8 workers on 2 cores behave like 8 machines whose compute dominates.
``--straggler`` makes some workers slower:

- ``RANK:FACTOR``: worker RANK is persistently FACTOR times slower (its emulated compute
  is C x FACTOR; with C = 0 its real step time is stretched by FACTOR);
- ``random:p=P,x=FACTOR``: every worker, at every step, is FACTOR times slower with
  probability P (transient slowdowns), drawn from a seed shared by nobody else.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dlcomm.errors import ConfigError
from dlcomm.registry import parse_spec

__all__ = ["Straggler", "parse_straggler", "slowdown", "step_delay"]


@dataclass(frozen=True)
class Straggler:
    rank: int | None      # None: random transient slowdowns on every worker
    factor: float
    probability: float = 1.0


def parse_straggler(text: str) -> Straggler:
    if text.startswith("random"):
        spec = parse_spec(text)
        try:
            p, x = float(spec.options["p"]), float(spec.options["x"])
        except (KeyError, ValueError):
            raise ConfigError(f"bad --straggler {text!r} (random:p=P,x=FACTOR)") from None
        if not (0 <= p <= 1 and x >= 1) or set(spec.options) - {"p", "x"}:
            raise ConfigError(f"bad --straggler {text!r}: need 0 <= p <= 1, x >= 1")
        return Straggler(None, x, p)
    rank_text, sep, factor_text = text.partition(":")
    try:
        rank, factor = int(rank_text), float(factor_text)
    except ValueError:
        raise ConfigError(f"bad --straggler {text!r} (RANK:FACTOR or random:p=P,x=FACTOR)"
                          ) from None
    if not sep or rank < 0 or factor < 1:
        raise ConfigError(f"bad --straggler {text!r}: need RANK >= 0 and FACTOR >= 1")
    return Straggler(rank, factor)


def slowdown(straggler: Straggler | None, rank: int, rng: random.Random) -> float:
    """This step's slowdown factor of worker ``rank`` (1: normal speed)."""
    if straggler is None:
        return 1.0
    if straggler.rank is None:
        return straggler.factor if rng.random() < straggler.probability else 1.0
    return straggler.factor if straggler.rank == rank else 1.0


def step_delay(compute_ms: float, real_s: float, factor: float) -> float:
    """Seconds to sleep after a step whose real compute took ``real_s``.

    Emulated compute C is stretched by the factor; without emulated compute, the real
    compute is stretched instead (a FACTOR-times slower worker takes (FACTOR - 1) x longer).
    """
    if compute_ms > 0:
        return compute_ms / 1000 * factor
    return real_s * (factor - 1)
