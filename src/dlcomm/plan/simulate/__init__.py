"""The simulator: one training iteration on thousands of accelerators (docs/simulation.md).

    from dlcomm.plan.simulate import SimConfig, simulate
    out = simulate(SimConfig("gpt3-175b", "fattree", 1024, "dp=16,pp=8,tp=8"))
    out["summary"]["iteration_s"]

Layers: ``algorithms`` (collectives as flow phases) -> ``network`` (flow patterns on a
planner topology, max-min sharing) -> ``collective`` (calls, exchanges, calibration) ->
``schedule`` (event-driven pipeline + DDP overlap on the fluid network) -> ``iteration``
(a catalog workload as stage plans). Around them: ``sweep`` (many runs), ``calibrate`` and
``validate`` (against the emulator), ``packet`` (the switch dataplane in virtual time),
``reproduce`` (published comparisons), ``report`` and ``commands`` (CLI).
Attributes load lazily so that ``import dlcomm.plan.simulate`` stays light.
"""

from typing import Any

__all__ = ["SimConfig", "simulate", "run_simulations", "ValidateConfig", "validate",
           "packet_check", "REPRODUCTIONS"]

_WHERE = {"SimConfig": "iteration", "simulate": "iteration", "run_simulations": "sweep",
          "ValidateConfig": "validate", "validate": "validate", "packet_check": "packet",
          "REPRODUCTIONS": "reproduce"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(f"dlcomm.plan.simulate.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'dlcomm.plan.simulate' has no attribute {name!r}")
