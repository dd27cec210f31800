"""The Python dataplane and the native one side by side, fed the same datagrams."""

from __future__ import annotations

from collections import Counter

import pytest

from dlcomm.native import available
from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import Job, JobTable
from dlcomm.switch.native_dataplane import spec_of

needs_native = pytest.mark.skipif(not available(), reason="the native data path is not built")

# what only one of them counts: the native loop's own counters
NATIVE_ONLY = {"recv_calls", "send_calls", "gro_segments", "slow_path"}


class Twins:
    """A Python :class:`Dataplane` and a native core with the same jobs (the same numbers,
    secrets and addresses: separate objects, so neither sees what the other did)."""

    def __init__(self, slots: int = 64, max_k: int = 4096) -> None:
        from dlcomm.native.switch import Core, Probe

        self.table = JobTable(slots, max_k)
        self.python = Dataplane(self.table)
        self.core = Core()
        self.probe = Probe(self.core)
        self.jobs: list[Job] = []

    def close(self) -> None:
        self.probe.close()
        self.core.close()

    def register(self, addresses, slots: int, k: int, auth: int = 1,
                 multicast_port: int | None = None, block: int = 0) -> Job:
        job = self.table.register(list(addresses), slots, k, auth=auth,
                                  multicast_port=multicast_port, block=block)
        self.python.add_job(job)
        self.core.add_job(spec_of(job))
        self.jobs.append(job)
        return job

    def live(self, job: Job) -> None:
        job.live = True
        self.core.set_live(job.job_id)

    def feed(self, datagram: bytes, src, now: float):
        """Both dataplanes' outputs for one datagram, as (address, bytes) lists."""
        py = [(addr, b"".join(bytes(p) for p in parts))
              for addr, parts in self.python.on_datagram(datagram, src, now)]
        native = self.probe.process(datagram, src, now)
        return py, native

    def counters(self):
        py = {k: v for k, v in self.python.counters.items() if v}
        native = {k: v for k, v in self.core.counters().items() if k not in NATIVE_ONLY}
        return py, native

    def job_state(self, job: Job, now: float):
        info = self.core.info(job.job_id, now)
        assert info is not None
        py = (dict(Counter(job.counters)), job.failure, self.python.waiting(job.job_id, now))
        return py, (info.counters, info.failure, info.waiting)


class Tee(Dataplane):
    """A Python dataplane that feeds every datagram to a native core as well and checks
    that both send the same bytes (for :func:`dlcomm.testing.fakenet.aggregate`: live
    workers drive it through rounds with loss, duplication and reordering)."""

    def __init__(self, table: JobTable) -> None:
        from dlcomm.native.switch import Core, Probe

        super().__init__(table)
        self.core = Core()
        self.probe = Probe(self.core)
        self.compared = 0

    def add_job(self, job: Job) -> None:
        super().add_job(job)
        self.core.add_job(spec_of(job))
        if job.live:
            self.core.set_live(job.job_id)

    def on_datagram(self, data, src, now: float = 0.0):
        py = super().on_datagram(data, src, now)
        expected = [(addr, b"".join(bytes(p) for p in parts)) for addr, parts in py]
        assert self.probe.process(bytes(data), src, now) == expected
        self.compared += 1
        return py

    def counters_agree(self) -> bool:
        py = {k: v for k, v in self.counters.items() if v}
        native = {k: v for k, v in self.core.counters().items() if k not in NATIVE_ONLY}
        return py == native

    def close(self) -> None:
        self.probe.close()
        self.core.close()
