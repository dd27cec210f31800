"""The order in which a pipeline device runs its forwards and backwards (1F1B, GPipe,
interleaved 1F1B); :mod:`dlcomm.plan.simulate.schedule` describes them and runs them."""

from __future__ import annotations

from dlcomm.errors import ConfigError

__all__ = ["SCHEDULES", "stage_order", "interleaved_order"]

SCHEDULES = ("1f1b", "gpipe", "interleaved")


def stage_order(schedule: str, pp: int, stage: int, micro: int) -> list[tuple[str, int]]:
    """Operations ("F"/"B", micro-batch) of ``stage`` in the order it runs them."""
    if schedule == "gpipe":
        return [("F", j) for j in range(micro)] + [("B", j) for j in range(micro)]
    if schedule != "1f1b":
        raise ConfigError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    warm = min(pp - stage - 1, micro)
    ops = [("F", j) for j in range(warm)]
    for i in range(micro - warm):
        ops += [("F", warm + i), ("B", i)]
    ops += [("B", j) for j in range(micro - warm, micro)]
    return ops


def interleaved_order(pp: int, device: int, micro: int,
                      chunks: int) -> list[tuple[str, int, int]]:
    """Operations ("F"/"B", micro-batch, chunk) of ``device`` under interleaved 1F1B
    (module docstring)."""
    if chunks < 1:
        raise ConfigError(f"model chunks must be >= 1, got {chunks}")
    if chunks > 1 and micro % pp:
        raise ConfigError(f"the interleaved schedule needs micro-batches ({micro}) to be a "
                          f"multiple of the pipeline stages ({pp})")
    total = micro * chunks

    def op(kind: str, k: int) -> tuple[str, int, int]:
        chunk = (k // pp) % chunks
        return (kind, (k // (pp * chunks)) * pp + k % pp,
                chunk if kind == "F" else chunks - 1 - chunk)
    if chunks == 1:
        return [(kind, j, 0) for kind, j in stage_order("1f1b", pp, device, micro)]
    warm = total if micro == pp else min((pp - device - 1) * 2 + (chunks - 1) * pp, total)
    ops = [op("F", k) for k in range(warm)]
    for i in range(total - warm):
        ops += [op("F", warm + i), op("B", i)]
    ops += [op("B", k) for k in range(total - warm, total)]
    return ops
