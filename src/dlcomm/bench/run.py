"""The parent side of benchmarks: place workers, run them, assemble the JSON result."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from typing import Any

from dlcomm.bench import JOB_DEADLINE_S
from dlcomm.bench.allreduce import AllreduceBench, bench_config_dict, summarize
from dlcomm.emulate.placement import ClusterPlacement, NetworkOptions, placement
from dlcomm.emulate.plan import parse_topology
from dlcomm.exchange.bounds import LinkFacts, bandwidth_bound_s
from dlcomm.results import new_result
from dlcomm.runtime.jobdir import job_directory
from dlcomm.runtime.launcher import launch
from dlcomm.runtime.placement import Placement
from dlcomm.switch.service import switches_for_job

__all__ = ["run_allreduce", "print_allreduce_table", "link_facts", "SwitchOptions"]


@dataclass(frozen=True)
class SwitchOptions:
    """How a job reaches its aggregation switch, if an exchange needs one."""

    addr: str | None = None     # use running switches (a:p,b:q); else start them here
    shards: int = 1             # switch processes to start
    drop_rate: float = 0.0      # loss injected on both sides


def link_facts(place: Placement, workers: int) -> LinkFacts | None:
    """The emulated network's rates, for bandwidth bounds (None on loopback)."""
    if not isinstance(place, ClusterPlacement):
        return None
    spec = place.cluster.plan.spec
    racks, per_rack, oversub = parse_topology(spec.topology, spec.hosts)
    if racks == 1:
        return LinkFacts(spec.rate_bps)
    return LinkFacts(spec.rate_bps, per_rack, per_rack * spec.rate_bps / oversub)


def run_allreduce(cfg: AllreduceBench, net: NetworkOptions, switch: SwitchOptions = SwitchOptions()
                  ) -> dict[str, Any]:
    """Run the all-reduce benchmark and return its ``bench-allreduce`` result."""
    start = time.perf_counter()
    with job_directory("bench") as tmp, \
            placement(net, cfg.workers) as place, \
            switches_for_job(cfg.exchanges, place.service_host, place.service_prefix(),
                             switch.addr, switch.shards, switch.drop_rate) as (specs, service):
        part = tmp / "measured.json"
        job = replace(cfg, exchanges=tuple(specs), result_path=str(part),
                      job_name=f"bench{os.getpid()}")
        launch(bench_config_dict(job), cfg.workers, place,
               entry=("run-job", "bench-allreduce"), deadline_s=JOB_DEADLINE_S)
        raw = json.loads(part.read_text())
        for entry, original in zip(raw["measured"], cfg.exchanges):
            entry["exchange"] = original
        links = link_facts(place, cfg.workers)
        info = place.info
    switch_stats = service.final_stats if service else None
    rows = summarize(raw)
    cores = os.cpu_count() or 1
    for row in rows:
        row["bound_s"] = (bandwidth_bound_s(row["exchange"], cfg.workers, cfg.size_bytes, links)
                          if links else None)
        row["time_over_bound"] = row["time_s"] / row["bound_s"] if row["bound_s"] else None
        row["cpu_utilization"] = row["cpu_s_per_rep"] / (row["time_s"] * cores)
        row["goodput_gbps"] = cfg.size_bytes * 8 / row["time_s"] / 1e9
    first = rows[0]["time_s"]
    result = new_result("bench-allreduce", {**bench_config_dict(cfg), "network": net.network,
                                            "bandwidth": net.bandwidth, "topology": net.topology,
                                            "cluster": net.cluster})
    result["network"] = info
    result["switch"] = switch_stats
    result["results"] = rows
    result["summary"] = {
        "workers": cfg.workers, "size_bytes": cfg.size_bytes,
        "time_s": {r["exchange"]: r["time_s"] for r in rows},
        f"speedup_over_{rows[0]['exchange']}": {r["exchange"]: first / r["time_s"] for r in rows},
        "wall_time_s": time.perf_counter() - start}
    return result


def print_allreduce_table(result: dict[str, Any], json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    s = result["summary"]
    speedups = next(v for k, v in s.items() if k.startswith("speedup_over_"))
    table = Table("exchange", "time", "bound", "time/bound", "speedup", "max |error|",
                  "wire tx/host", "CPU", title=f"all-reduce of {s['size_bytes'] / 1e6:.0f} MB "
                  f"on {s['workers']} workers ({result['network'].get('network')})",
                  title_justify="left")
    for r in result["results"]:
        wire = r.get("wire_bytes_per_host")
        tx = f"{sum(w['tx_bytes'] for w in wire) / len(wire) / 1e6:.1f} MB" if wire else "-"
        table.add_row(r["exchange"], f"{r['time_s'] * 1e3:.0f} ms",
                      f"{r['bound_s'] * 1e3:.0f} ms" if r["bound_s"] else "-",
                      f"{r['time_over_bound']:.2f}" if r["time_over_bound"] else "-",
                      f"{speedups[r['exchange']]:.2f}x", f"{r['max_abs_error']:.2e}", tx,
                      f"{r['cpu_utilization']:.0%}")
    if json_path:
        table.caption = f"JSON result: {json_path}"
    Console().print(table)
