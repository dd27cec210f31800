"""A job's workers as the dataplane tests drive them: each rank seals its own packets and
reads the switch's with its own keys (the pure Channel of wire/channel.py)."""

from __future__ import annotations

import numpy as np

from dlcomm.switch.jobs import Job
from dlcomm.wire.auth import JobKeys
from dlcomm.wire.channel import Channel
from dlcomm.wire.packet import DATA, HEADER_SIZE, PROBE, RESEND, Header, decode_header


class Crew:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.channels = [Channel(JobKeys.derive(job.secret, job.job_id, job.auth, [r]), r)
                         for r in range(job.workers)]

    def packet(self, header: Header, body: bytes = b"") -> bytes:
        """``header`` and ``body`` sealed by rank ``header.worker``."""
        rank = header.worker if header.worker < len(self.channels) else 0
        return b"".join(bytes(p) for p in self.channels[rank].seal(header, body))

    def data(self, worker: int, values: list[int] | np.ndarray, slot: int = 0, seq: int = 0,
             tsi: int = 0, exp: int = 0, flags: int = 0, pad: int | None = None) -> bytes:
        """A DATA packet; a probe is padded to the answer it asks for (or ``pad`` bytes)."""
        hdr = Header(DATA, self.job.job_id, worker, slot, len(values), seq, tsi, exp,
                     flags=flags)
        if flags & PROBE:
            size = pad if pad is not None else (
                4 * len(values) if flags & RESEND else (self.job.workers + 7) // 8)
            return self.packet(hdr, bytes(size))
        return self.packet(hdr, np.asarray(values, np.int32).tobytes())

    def read(self, outputs: list) -> list[tuple[tuple[str, int], Header, bytes]]:
        """Every output as (address, header, payload), opened by the rank it goes to."""
        out = []
        for addr, parts in outputs:
            datagram = b"".join(bytes(p) for p in parts)
            rank = self.job.addresses.index(addr) if addr in self.job.addresses else 0
            hdr = decode_header(datagram)
            payload = self.channels[rank].open(hdr, memoryview(datagram))
            out.append((addr, hdr, bytes(payload)))
        return out

    def values(self, outputs: list) -> list[tuple[tuple[str, int], Header, list[int]]]:
        return [(a, h, np.frombuffer(p, np.int32).tolist()) for a, h, p in self.read(outputs)]


def size_of(outputs: list) -> list[int]:
    return [sum(len(p) for p in parts) for _, parts in outputs]


__all__ = ["Crew", "size_of", "HEADER_SIZE"]
