"""The worker runtime: env:// rendezvous facts and the process group's lifetime.

Workers are ordinary torch.distributed processes: whoever starts them (``dlcomm train``,
``torchrun`` on one or many machines, any launcher) sets RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT (and optionally LOCAL_RANK, LOCAL_WORLD_SIZE).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dlcomm.errors import ConfigError
from dlcomm.runtime.failures import report_failure
from dlcomm.runtime.placement import WIRE_DEV_VAR

__all__ = ["WorkerEnv", "process_group", "WIRE_DEV_VAR", "wire_bytes", "set_threads"]



def wire_bytes() -> dict[str, int] | None:
    """Kernel byte counters of this host's interface ``$DLCOMM_WIRE_DEV`` (None if unset).

    The emulated network sets it to ``eth0`` inside each host namespace; on real machines
    users may set it to the NIC that carries the job's traffic.
    """
    dev = os.environ.get(WIRE_DEV_VAR)
    if not dev:
        return None
    base = f"/sys/class/net/{dev}/statistics"
    try:
        with open(f"{base}/tx_bytes") as tx, open(f"{base}/rx_bytes") as rx:
            return {"tx_bytes": int(tx.read()), "rx_bytes": int(rx.read())}
    except OSError:
        return None


@dataclass(frozen=True)
class WorkerEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> WorkerEnv:
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if v not in environ]
        if missing:
            raise ConfigError(f"not started by a launcher: {', '.join(missing)} unset "
                              "(use `dlcomm train` or torchrun)")
        try:
            rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
            env = cls(rank, world, int(environ.get("LOCAL_RANK", rank)),
                      int(environ.get("LOCAL_WORLD_SIZE", world)), environ["MASTER_ADDR"],
                      int(environ["MASTER_PORT"]))
        except ValueError as exc:
            raise ConfigError(f"bad rendezvous variable: {exc}") from exc
        if not 0 <= env.rank < env.world_size:
            raise ConfigError(f"RANK {env.rank} is outside WORLD_SIZE {env.world_size}")
        return env

    def threads(self, requested: int) -> int:
        """torch threads per worker: as requested, else the cores shared among local workers."""
        return requested or max(1, (os.cpu_count() or 1) // self.local_world_size)


@contextlib.contextmanager
def process_group(env: WorkerEnv, timeout_s: float, backend: str = "gloo",
                  pg_options: object = None) -> Iterator[None]:
    """A process group over env:// (gloo, or a backend such as ``dlcomm`` with its
    ``pg_options``) for the duration of the block.

    A failure inside the block is reported (:func:`~dlcomm.runtime.failures.report_failure`)
    before the group is torn down, so the report precedes the peers' broken connections.
    """
    dist.init_process_group(backend, init_method="env://", rank=env.rank,
                            world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            pg_options=pg_options)
    try:
        yield
        dist.barrier()  # nobody tears down while a peer still works (e.g. rank 0 writing)
    except BaseException as exc:
        report_failure(exc)
        raise
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
