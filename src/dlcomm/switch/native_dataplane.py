"""The switch dataplane with its dense jobs in native code (dlcomm.native.switch).

A job of at most 64 workers, dense or sparse, is served by the C dataplane, rule for rule
the one of :mod:`dlcomm.switch.dataplane`; a larger one by that Python dataplane, which
this class also is: its datagrams reach it through the native slow path. The Python
objects of native jobs (:class:`~dlcomm.switch.jobs.Job`) learn their counters, last packet
and failure from :meth:`NativeDataplane.sync`, which the server calls several times a
second and before every statistics answer.
"""

from __future__ import annotations

from collections import Counter

from dlcomm.native.switch import MAX_NATIVE_WORKERS, Core, JobSpec
from dlcomm.switch.dataplane import Dataplane
from dlcomm.switch.jobs import Job, JobTable
from dlcomm.wire.auth import AUTH_NONE, all_key_bytes

__all__ = ["NativeDataplane", "spec_of", "served_natively"]


def served_natively(job: Job) -> bool:
    return job.workers <= MAX_NATIVE_WORKERS


def spec_of(job: Job) -> JobSpec:
    """The native dataplane's view of a job (its raw packet keys included)."""
    native = served_natively(job)
    keys = all_key_bytes(job.secret, job.job_id, job.workers) \
        if native and job.auth != AUTH_NONE else b""
    return JobSpec(job.job_id, job.addresses, job.slot_count, job.k, job.limit, job.auth,
                   keys, job.group, python=not native, block=job.block)


class NativeDataplane(Dataplane):
    """Jobs of at most 64 workers in C, the others in Python (module docstring)."""

    def __init__(self, table: JobTable, core: Core) -> None:
        super().__init__(table)
        self.core = core
        self.native: dict[int, Job] = {}

    def add_job(self, job: Job) -> None:
        spec = spec_of(job)
        if spec.python:
            super().add_job(job)
        else:
            self.native[job.job_id] = job
        self.core.add_job(spec)

    def remove_job(self, job_id: int) -> None:
        self.native.pop(job_id, None)
        self.core.remove_job(job_id)
        super().remove_job(job_id)

    def job_live(self, job: Job) -> None:
        self.core.set_live(job.job_id, job.live)

    def waiting(self, job_id: int, now: float) -> dict[str, object] | None:
        if job_id in self.native:
            info = self.core.info(job_id, now)
            return info.waiting if info else None
        return super().waiting(job_id, now)

    def all_counters(self) -> dict[str, int]:
        merged = Counter(self.counters)
        merged.update(self.core.counters())
        return dict(merged)

    def sync(self, now: float) -> bool:
        """Copy what the native jobs did into their Job objects; True if one failed."""
        failed = False
        for job_id, job in list(self.native.items()):
            info = self.core.info(job_id, now)
            if info is None:
                continue
            job.counters = info.counters
            job.last_packet = max(job.last_packet, info.last_packet)
            if info.failure and not job.failure:
                job.failure = info.failure
                self.failures.append((job_id, info.failure))
                failed = True
        return failed
