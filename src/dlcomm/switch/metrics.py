"""The switch's counters for Prometheus: ``dlcomm switch serve --metrics HOST:PORT``.

Exported through the Prometheus client library (its text format over HTTP, on a thread of
its own), read from :meth:`SwitchServer.stats` at every scrape:

- ``dlcomm_switch_<counter>_total``: packets and bytes in and out, drops by reason
  (``drop_bad_tag``, ``drop_replay``, ...), retransmissions, completions, control-plane
  events (refused connections, bad tokens, registrations, jobs ended by why);
- ``dlcomm_switch_job_<counter>_total{job,name}``: the same per job;
- gauges: slots in use and in all, jobs, live jobs, control connections, and per job the
  seconds its oldest incomplete round has waited (``dlcomm_switch_job_waiting_seconds``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.switch.client import parse_addresses

__all__ = ["export", "collector"]


def _name(counter: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", counter)


def collector(stats: Any) -> Any:
    """A Prometheus collector over ``stats()`` (a callable returning the switch's stats)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self) -> Iterator[Any]:
            s = stats()
            for key, value in sorted(s["counters"].items()):
                yield CounterMetricFamily(f"dlcomm_switch_{_name(key)}", key, value=value)
            yield GaugeMetricFamily("dlcomm_switch_slots_in_use", "slots held by jobs",
                                    value=s["slots_in_use"])
            yield GaugeMetricFamily("dlcomm_switch_slots", "slots in the pool",
                                    value=s["slots_total"])
            jobs = s["jobs"]
            yield GaugeMetricFamily("dlcomm_switch_jobs", "registered jobs", value=len(jobs))
            yield GaugeMetricFamily("dlcomm_switch_live_jobs", "live jobs",
                                    value=sum(1 for j in jobs.values() if j.get("live")))
            yield GaugeMetricFamily("dlcomm_switch_control_connections", "open connections",
                                    value=s["control"]["connections"])
            per_job: dict[str, Any] = {}
            waiting = GaugeMetricFamily("dlcomm_switch_job_waiting_seconds",
                                        "age of the job's oldest incomplete round",
                                        labels=["job", "name"])
            for job_id, job in jobs.items():
                labels = [job_id, str(job.get("name", ""))]
                for key, value in job.items():
                    if isinstance(value, int) and not isinstance(value, bool) and \
                            key not in ("workers", "slots", "k"):
                        family = per_job.setdefault(key, CounterMetricFamily(
                            f"dlcomm_switch_job_{_name(key)}", key, labels=["job", "name"]))
                        family.add_metric(labels, value)
                if job.get("waiting"):
                    waiting.add_metric(labels, job["waiting"]["since_s"])
            yield from per_job.values()
            yield waiting

    return _Collector()


def export(server: Any, where: str) -> None:
    """Serve ``server``'s counters on HOST:PORT (HTTP, the Prometheus text format)."""
    from prometheus_client import CollectorRegistry, start_http_server

    (host, port), = parse_addresses(where)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector(server.stats))
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"cannot export metrics on {where}: {exc.strerror or exc}") from exc
