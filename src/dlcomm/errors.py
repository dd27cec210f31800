"""The exceptions dlcomm raises across its package boundaries.

    DlcommError                 anything dlcomm reports to a user as one line
     ├─ ConfigError             bad options, specs, config files, paths, ports
     │   ├─ RegistryError       an unknown name in a registry (workload, exchange, ...)
     │   └─ NativeMissing       the native data path was not built (dlcomm.native.lib)
     ├─ WorkerFailed            a worker process of a job died or raised
     ├─ ExchangeError           a gradient exchange could not complete
     │   └─ ExchangeTimeout     ... because a peer or service did not answer in time
     ├─ Interrupted             SIGINT/SIGTERM/SIGHUP stopped a job (dlcomm.runtime.signals)
     ├─ SwitchFull              the switch has no free slots for a job (dlcomm.switch.jobs)
     └─ ClusterError            an ip/tc command failed (dlcomm.emulate.cluster)

The CLI prints ``dlcomm: error: <message>`` and exits with ``exit_code``.
``OSError`` and timeouts are translated into these at the I/O edge (``raise ... from exc``).
The tree is checked against the classes (tests/test_errors.py).
"""

from __future__ import annotations

__all__ = [
    "DlcommError",
    "ConfigError",
    "RegistryError",
    "WorkerFailed",
    "ExchangeError",
    "ExchangeTimeout",
]


class DlcommError(Exception):
    """Base class: an error with a one-line message meant for the user."""

    exit_code = 1


class ConfigError(DlcommError):
    """Invalid user input: options, specs, config files, output paths, ports."""

    exit_code = 2


class RegistryError(ConfigError):
    """A name that no registry knows."""


class WorkerFailed(DlcommError):
    """A worker of a job died (signal, non-zero exit) or raised an exception."""

    def __init__(self, rank: int, cause: str) -> None:
        super().__init__(f"worker rank {rank} failed: {cause}")
        self.rank = rank
        self.cause = cause


class ExchangeError(DlcommError):
    """A gradient exchange could not complete."""


class ExchangeTimeout(ExchangeError):
    """A peer or a service did not answer within its deadline."""
