"""The switch's counters for Prometheus: ``dlcomm switch serve --metrics HOST:PORT``.

Exported through the Prometheus client library (its text format over HTTP, on a thread of
its own), read from :meth:`SwitchServer.stats` at every scrape:

- ``dlcomm_switch_<counter>_total``: packets and bytes in and out, retransmissions,
  completions, probes, control-plane events (refused connections, bad requests,
  registrations, jobs ended by why);
- ``dlcomm_switch_drops_total{reason}``: datagrams dropped, by reason (``bad_tag``,
  ``replay``, ``bad_source``, ...), and ``dlcomm_switch_auth_failures_total``: forged or
  replayed datagrams and wrong admin tokens, tickets or nonces;
- ``dlcomm_switch_job_<counter>_total{job,name}`` and
  ``dlcomm_switch_job_drops_total{job,name,reason}``: the same per job;
- gauges: slots in use and in all, jobs, live jobs, control connections, and per job the
  seconds its oldest incomplete round has waited, with the ranks it waits for
  (``dlcomm_switch_job_waiting_seconds{job,name,ranks}``).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

# imported with this module, before the switch serves: an import at the first scrape may
# find every file descriptor taken by a flood of connections
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dlcomm.errors import ConfigError
from dlcomm.sockets import OUT_OF_RESOURCES
from dlcomm.switch.client import parse_addresses

__all__ = ["export", "collector", "families", "AUTH_FAILURES"]


AUTH_FAILURES = ("drop_bad_tag", "drop_replay", "control_bad_tokens", "control_bad_tickets",
                 "control_bad_nonces")
_JOB_FIELDS_NOT_COUNTERS = ("workers", "slots", "k")


def _name(counter: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", counter)


def families(s: dict[str, Any]) -> list[Any]:
    """The metric families of one stats snapshot ``s`` (:meth:`SwitchServer.stats`)."""
    out: list[Any] = []
    counters = s["counters"]
    drops = CounterMetricFamily("dlcomm_switch_drops", "datagrams dropped, by reason",
                                labels=["reason"])
    for key, value in sorted(counters.items()):
        if key.startswith("drop_"):
            drops.add_metric([key[5:]], value)
        else:
            out.append(CounterMetricFamily(f"dlcomm_switch_{_name(key)}", key, value=value))
    out.append(drops)
    out.append(CounterMetricFamily("dlcomm_switch_auth_failures",
                                   "forged or replayed datagrams, wrong tokens, tickets, nonces",
                                   value=sum(counters.get(k, 0) for k in AUTH_FAILURES)))
    jobs = s["jobs"]
    for name, doc, value in (
            ("slots_in_use", "slots held by jobs", s["slots_in_use"]),
            ("slots", "slots in the pool", s["slots_total"]),
            ("jobs", "registered jobs", len(jobs)),
            ("live_jobs", "live jobs", sum(1 for j in jobs.values() if j.get("live"))),
            ("control_connections", "open control connections",
             s["control"]["connections"])):
        out.append(GaugeMetricFamily(f"dlcomm_switch_{name}", doc, value=value))
    per_job: dict[str, Any] = {}
    job_drops = CounterMetricFamily("dlcomm_switch_job_drops", "a job's dropped datagrams",
                                    labels=["job", "name", "reason"])
    waiting = GaugeMetricFamily("dlcomm_switch_job_waiting_seconds",
                                "age of the job's oldest incomplete round",
                                labels=["job", "name", "ranks"])
    for job_id, job in jobs.items():
        labels = [job_id, str(job.get("name", ""))]
        for key, value in job.items():
            if not isinstance(value, int) or isinstance(value, bool) or \
                    key in _JOB_FIELDS_NOT_COUNTERS:
                continue
            if key.startswith("drop_"):
                job_drops.add_metric([*labels, key[5:]], value)
                continue
            per_job.setdefault(key, CounterMetricFamily(
                f"dlcomm_switch_job_{_name(key)}", key, labels=["job", "name"])
            ).add_metric(labels, value)
        if job.get("waiting"):
            ranks = ",".join(str(r) for r in job["waiting"]["ranks"])
            waiting.add_metric([*labels, ranks], job["waiting"]["since_s"])
    return [*out, *per_job.values(), job_drops, waiting]


def collector(stats: Any) -> Any:
    """A Prometheus collector over ``stats()`` (a callable returning the switch's stats)."""

    class _Collector:
        def collect(self) -> Iterator[Any]:
            yield from families(stats())

    return _Collector()


class _Exporter(ThreadingMixIn, WSGIServer):
    """A thread per scrape, as the client library's own server; but an accept that fails
    for want of descriptors or memory (a flood of connections) waits a second before the
    next try, as the control plane's does. The listening socket stays readable meanwhile,
    and trying again at once would spin a core."""

    daemon_threads = True
    retry_s = 1.0

    def get_request(self) -> Any:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES:
                time.sleep(self.retry_s)
            raise


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


def export(server: Any, where: str) -> None:
    """Serve ``server``'s counters on HOST:PORT (HTTP, the Prometheus text format) from a
    thread of their own."""
    (host, port), = parse_addresses(where)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector(server.stats))
    try:
        httpd = make_server(host, port, make_wsgi_app(registry), _Exporter, _Quiet)
    except OSError as exc:
        raise ConfigError(f"cannot export metrics on {where}: {exc.strerror or exc}") from exc
    threading.Thread(target=httpd.serve_forever, daemon=True,
                     name="dlcomm-switch-metrics").start()
