"""Many simulations in one result: sweeps over the number of accelerators and what-if
comparisons of exchanges per topology (``dlcomm simulate --sweep ... --exchange a,b``).

For every accelerator count N of the sweep (or the one asked), every topology and every
exchange: one :func:`dlcomm.plan.simulate.iteration.simulate` with the topology sized to N and
data parallelism filling it (dp = N / (pp x tp) unless dp is given without a sweep).
Exchanges that aggregate in the network run on fat trees with ``ina=1`` added (the same
network with aggregating switches); on topologies without switches that can aggregate
(tori, meshes, dragonflies) they are reported as unavailable. Per (N, topology) the
comparison gives each exchange's speedup over the first one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.collective import parse_exchange
from dlcomm.plan.simulate.iteration import SimConfig, build_topology_for, simulate
from dlcomm.plan.traffic import parse_parallelism
from dlcomm.registry import Spec, parse_spec
from dlcomm.results import new_result

__all__ = ["parse_sweep", "run_simulations", "SUMMARY_KEYS"]

SUMMARY_KEYS = ("iteration_s", "compute_s", "pipeline_s", "bubble_s", "exposed_comm_s",
                "comm_share", "samples_per_s", "accelerators", "simulate_s")


def parse_sweep(text: str) -> list[int]:
    """``accelerators=64,256,1024`` -> [64, 256, 1024]."""
    key, eq, values = text.partition("=")
    if not eq or key.strip() != "accelerators":
        raise ConfigError(f"bad --sweep {text!r} (expected accelerators=N,N,...)")
    try:
        sizes = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"bad --sweep {text!r}: accelerator counts are integers") from None
    if not sizes or min(sizes) < 2:
        raise ConfigError(f"bad --sweep {text!r}: give counts >= 2")
    return sizes


def _with_ina(topology: str) -> str:
    spec = parse_spec(topology)
    if spec.name == "fattree" and spec.options.get("ina", "0") in ("0", "false", "no", "off"):
        return str(Spec(spec.name, {**spec.options, "ina": "1"}))
    return topology


def _without_dp(parallelism: str) -> str:
    if not parallelism.strip():
        return ""
    if "=" not in parallelism:
        par = parse_parallelism(parallelism)
        return f"pp={par.pp},tp={par.tp}"
    spec = parse_spec("p:" + parallelism)
    return ",".join(f"{k}={v}" for k, v in spec.options.items() if k != "dp")


def run_simulations(base: SimConfig, topologies: Sequence[str], exchanges: Sequence[str],
                    sizes: Sequence[int] | None = None,
                    say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Simulate every (size, topology, exchange); the ``simulate`` result (module docstring)."""
    start = time.perf_counter()
    sweeping = sizes is not None
    counts = list(sizes) if sizes else [base.accelerators]
    many = len(counts) * len(topologies) * len(exchanges) > 1
    for n in counts:                          # bad specs fail now, not after hours of runs
        for topology in topologies:
            build_topology_for(replace(base, topology=topology, accelerators=n))
    runs: list[dict[str, Any]] = []
    detail: dict[str, Any] | None = None
    for n in counts:
        for topology in topologies:
            for exchange in exchanges:
                kind, _ = parse_exchange(exchange)
                topo = _with_ina(topology) if kind != "ring" else topology
                cfg = replace(base, topology=topo, exchange=exchange, accelerators=n,
                              parallelism=_without_dp(base.parallelism) if sweeping
                              else base.parallelism)
                row: dict[str, Any] = {"accelerators_requested": n, "topology": topology,
                                       "exchange": exchange}
                try:
                    out = simulate(cfg)
                except ConfigError as exc:
                    if not many or "aggregat" not in str(exc):
                        raise
                    row.update({"available": False, "reason": str(exc)})
                    runs.append(row)
                    if say:
                        say(f"N={n} {topology} {exchange}: unavailable ({exc})")
                    continue
                s = out["summary"]
                row.update({"available": True, "spec": out["resolved"]["topology"]["spec"],
                            "topology_name": out["resolved"]["topology"]["name"],
                            "parallelism": out["resolved"]["parallelism"],
                            "exchange_label": s["exchange"],
                            **{key: s[key] for key in SUMMARY_KEYS},
                            "comm_busy_s": s["comm_busy_s"],
                            "collectives": out["collectives"]})
                runs.append(row)
                detail = detail or out
                if say:
                    say(f"N={s['accelerators']} {out['resolved']['topology']['name']} "
                        f"{s['exchange']}: {s['iteration_s'] * 1e3:.1f} ms per iteration, "
                        f"communication exposed {s['comm_share']:.1%} "
                        f"(simulated in {s['simulate_s']:.2f} s)")
    result = new_result("simulate", {**base.to_dict(), "topologies": list(topologies),
                                     "exchanges": list(exchanges),
                                     "sweep_accelerators": list(sizes) if sizes else None})
    result["runs"] = runs
    result["comparisons"] = _comparisons(runs)
    if not many and detail is not None:
        result["stages"] = detail["stages"]
        result["collectives"] = detail["collectives"]
        result["resolved"] = detail["resolved"]
        result["summary"] = dict(detail["summary"])
    else:
        ok = [r for r in runs if r["available"]]
        fastest = min(ok, key=lambda r: r["iteration_s"]) if ok else None
        result["summary"] = {"runs": len(runs), "available": len(ok),
                             "fastest": {k: fastest[k] for k in (
                                 "accelerators", "topology", "exchange", "iteration_s")}
                             if fastest else None}
    result["summary"]["wall_time_s"] = time.perf_counter() - start
    return result


def _comparisons(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = []
    for r in runs:
        key = (r["accelerators_requested"], r["topology"])
        if key not in keys:
            keys.append(key)
    for n, topology in keys:
        group = [r for r in runs if (r["accelerators_requested"], r["topology"]) == (n, topology)]
        base = next((r for r in group if r["available"]), None)
        if base is None or len(group) < 2:
            continue
        out.append({"accelerators_requested": n, "topology": topology,
                    "baseline": base["exchange"],
                    "speedup": {r["exchange"]: (base["iteration_s"] / r["iteration_s"]
                                                if r["available"] else None) for r in group}})
    return out
