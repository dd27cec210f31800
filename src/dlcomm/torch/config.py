"""What the ``dlcomm`` c10d backend does, from init options and the environment, checked.

Precedence: ``init_process_group(..., pg_options=BackendOptions(...))`` over the
environment over the defaults. Everything is checked before a socket is opened, so that a
bad configuration fails ``init_process_group`` with one line.

==========================  =====================================  ===========================
variable                    meaning                                default
==========================  =====================================  ===========================
``DLCOMM_EXCHANGE``         the exchange spec large float           ``switch``
                            all-reduces go through (``switch``,
                            ``sparse-switch``, ``auto``,
                            ``compressed:method=...,over=...``,
                            ``ring`` = everything to gloo)
``DLCOMM_SWITCH``           a running switch to join (HOST:PORT,    none: the job starts its
                            ``+`` between shards)                   own switch on rank 0
``DLCOMM_SWITCH_FP``        its certificate's sha256 (printed by
                            ``dlcomm switch serve``)
``DLCOMM_SWITCH_TOKEN_FILE``  its admin token (rank 0 registers)
``DLCOMM_MIN_BYTES``        smaller all-reduces go to gloo          4096
``DLCOMM_DTYPES``           dtypes that go through the exchange     float32,float16,bfloat16
``DLCOMM_SWITCH_BIND``      where the job's own switch listens      the address rank 0 uses
                                                                    to reach MASTER_ADDR
``DLCOMM_SWITCH_STATS``     file for the own switch's final         none
                            counters (JSON)
==========================  =====================================  ===========================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import torch

from dlcomm.errors import ConfigError, DlcommError
from dlcomm.registry import Spec

__all__ = ["BackendOptions", "BackendConfig", "resolve", "DTYPES", "EXCHANGE_ENV"]

EXCHANGE_ENV = "DLCOMM_EXCHANGE"
MIN_BYTES_ENV = "DLCOMM_MIN_BYTES"
DTYPES_ENV = "DLCOMM_DTYPES"
BIND_ENV = "DLCOMM_SWITCH_BIND"
STATS_ENV = "DLCOMM_SWITCH_STATS"
DEFAULT_MIN_BYTES = 4096
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}
DEFAULT_DTYPES = "float32,float16,bfloat16"  # float64 keeps gloo's exact sums by default


@dataclass(frozen=True)
class BackendOptions:
    """``pg_options`` of ``init_process_group(backend="dlcomm")``; None = from the
    environment (see the module's table)."""

    exchange: str | None = None
    min_bytes: int | None = None
    dtypes: str | None = None
    switch_bind: str | None = None
    switch_stats: str | None = None


@dataclass(frozen=True)
class BackendConfig:
    """The checked configuration of one dlcomm process group."""

    exchange: Spec                       # "ring": every collective goes to gloo
    min_bytes: int = DEFAULT_MIN_BYTES
    dtypes: frozenset[torch.dtype] = field(
        default_factory=lambda: frozenset({torch.float32, torch.float16, torch.bfloat16}))
    switch_bind: str | None = None
    switch_stats: str | None = None

    @property
    def uses_exchange(self) -> bool:
        """Whether any all-reduce goes anywhere but gloo."""
        return self.exchange.name != "ring"


def _pick(options: BackendOptions, name: str, env: Mapping[str, str], var: str) -> str | None:
    value = getattr(options, name)
    return str(value) if value is not None else env.get(var) or None


def _dtypes(text: str) -> frozenset[torch.dtype]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(DTYPES))
    if unknown or not names:
        raise ConfigError(f"{DTYPES_ENV}: unknown dtype(s) {', '.join(unknown) or '(none)'}"
                          f" (choose from {', '.join(DTYPES)})")
    return frozenset(DTYPES[n] for n in names)


def _exchange(text: str) -> Spec:
    from dlcomm.exchange import EXCHANGES  # the registry fills itself on import

    try:
        return EXCHANGES.check(text)
    except DlcommError as exc:
        raise ConfigError(f"{EXCHANGE_ENV}: {exc}") from exc


def resolve(options: object = None, env: Mapping[str, str] = os.environ) -> BackendConfig:
    """The configuration from ``pg_options`` (a :class:`BackendOptions`, a dict of its
    fields, or None) and ``env``; raises :class:`ConfigError` naming what is wrong."""
    if options is None:
        opts = BackendOptions()
    elif isinstance(options, BackendOptions):
        opts = options
    elif isinstance(options, Mapping):
        known = {f.name for f in fields(BackendOptions)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"dlcomm backend: unknown option(s) {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(known))})")
        opts = BackendOptions(**options)
    else:
        raise ConfigError(f"dlcomm backend: pg_options must be dlcomm.torch.BackendOptions "
                          f"or a dict, got {type(options).__name__}")
    exchange = _exchange(_pick(opts, "exchange", env, EXCHANGE_ENV) or "switch")
    min_text = _pick(opts, "min_bytes", env, MIN_BYTES_ENV) or str(DEFAULT_MIN_BYTES)
    try:
        min_bytes = int(min_text)
    except ValueError:
        raise ConfigError(f"{MIN_BYTES_ENV} must be a whole number of bytes, "
                          f"got {min_text!r}") from None
    if min_bytes < 0:
        raise ConfigError(f"{MIN_BYTES_ENV} must be >= 0, got {min_bytes}")
    dtypes = _dtypes(_pick(opts, "dtypes", env, DTYPES_ENV) or DEFAULT_DTYPES)
    return BackendConfig(exchange, min_bytes, dtypes, _pick(opts, "switch_bind", env, BIND_ENV),
                         _pick(opts, "switch_stats", env, STATS_ENV))
