"""``dlcomm switch serve --metrics``: per-reason and per-job counters in the Prometheus text
format, scraped over HTTP from a live switch while a job waits on a missing rank."""

from __future__ import annotations

import socket
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from dlcomm.switch.service import running_switches
from dlcomm.wire.packet import DATA, Header
from tests.switch.live import own_job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_metrics_count_drops_by_reason_auth_failures_and_a_waiting_rank():
    port = free_port()
    with running_switches("127.0.0.1", extra_args=["--metrics", f"127.0.0.1:{port}"]) as svc:
        address, fp = svc.addresses[0], svc.fingerprints[0]
        job = own_job(address, fp, workers=2, k=16, slots=2)
        try:
            values = bytes(64)
            job.send(0, Header(DATA, job.job, 0, 0, 16, 0, 0, 0), values, address)
            forged = bytearray(job.send(1, Header(DATA, job.job, 1, 1, 16, 0, 16, 0), values,
                                        address))
            forged[-1] ^= 1                     # its tag no longer verifies
            job.socks[1].sendto(bytes(forged), address)
            deadline = time.monotonic() + 10
            while True:
                metrics = scrape(port)
                drops = {s.labels["reason"]: s.value for s in
                         metrics.get("dlcomm_switch_drops", [])}
                if drops.get("bad_tag") or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert drops["bad_tag"] >= 1, drops
            assert metrics["dlcomm_switch_auth_failures"][0].value >= 1
            assert metrics["dlcomm_switch_live_jobs"][0].value == 1
            job_drops = [s for s in metrics["dlcomm_switch_job_drops"]
                         if s.labels["job"] == str(job.job)]
            assert {s.labels["reason"] for s in job_drops} >= {"bad_tag"}
            waiting = metrics["dlcomm_switch_job_waiting_seconds"]
            assert [(s.labels["job"], s.labels["ranks"]) for s in waiting] == \
                [(str(job.job), "1")]                # slot 0 waits for rank 1
            packets = {s.labels["job"]: s.value for s in metrics["dlcomm_switch_job_packets_in"]}
            assert packets[str(job.job)] >= 2
        finally:
            job.close()
