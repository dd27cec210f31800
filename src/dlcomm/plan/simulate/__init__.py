"""The simulator: one training iteration on thousands of accelerators (docs/simulation.md).

    from dlcomm.plan.simulate import SimConfig, simulate
    out = simulate(SimConfig("gpt3-175b", "fattree", 1024, "dp=16,pp=8,tp=8"))
    out["summary"]["iteration_s"]

Layers: ``algorithms`` (collectives as flow phases) -> ``fluid`` (flow patterns on a
planner topology, max-min sharing) -> ``collective`` (calls, exchanges, calibration
constants) -> ``schedule`` (event-driven pipeline + DDP overlap on the fluid network) ->
``plans`` (a catalog workload as stage plans) -> ``iteration`` (one configured iteration
and its result). Around them: ``sweep`` (many runs), ``calibration`` (the modelled
all-reduce and the fit that measured constants come from), ``packet`` (the switch
dataplane in virtual time, over dlcomm.testing's fake network), ``reproduce`` (published
comparisons), ``report`` and ``commands`` (CLI). Pure planning
code: no processes, no sockets; calibrating and validating against the emulator, which
runs both, is :mod:`dlcomm.bench.calibrate` and :mod:`dlcomm.bench.validate`.
Attributes load lazily so that ``import dlcomm.plan.simulate`` stays light.
"""

from typing import Any

__all__ = ["SimConfig", "simulate", "run_simulations", "packet_check", "REPRODUCTIONS"]

_WHERE = {"SimConfig": "iteration", "simulate": "iteration", "run_simulations": "sweep",
          "packet_check": "packet", "REPRODUCTIONS": "reproduce"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(f"dlcomm.plan.simulate.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'dlcomm.plan.simulate' has no attribute {name!r}")
