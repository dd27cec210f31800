"""One JSON result schema for every run (training, benchmarks, emulation, planning).

Every command that produces numbers writes one JSON document::

    {"schema": "dlcomm.result/1", "kind": "train", "created": ISO-8601,
     "config": {... all options ..., "versions": {...}, "host": {...}},
     "summary": {... headline numbers ...},
     ... kind-specific series (steps, evals, workers, results, ...) ...}

Tables, plots, benchmarks and the docs read this JSON; nothing parses log text. Files are
written atomically (temporary file + rename), so a failed run never leaves a partial file.
The schema is documented in docs/results.md.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from dlcomm.errors import ConfigError

__all__ = ["SCHEMA", "new_result", "write_json", "write_atomic", "check_writable",
           "versions", "host_facts", "validate_result", "REQUIRED_SUMMARY", "read_table_file"]

SCHEMA = "dlcomm.result/1"

REQUIRED_SUMMARY: dict[str, tuple[str, ...]] = {
    "train": ("final_loss", "steps", "time_per_step_s", "comm_wait_per_step_s",
              "bytes_sent_per_worker", "bytes_received_per_worker"),
}


def versions() -> dict[str, str]:
    import numpy
    import torch

    import dlcomm
    return {"dlcomm": dlcomm.__version__, "torch": torch.__version__,
            "numpy": numpy.__version__, "python": platform.python_version()}


def host_facts() -> dict[str, Any]:
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1)}


def new_result(kind: str, config: dict[str, Any]) -> dict[str, Any]:
    """A result skeleton with config, versions and host facts filled in."""
    return {"schema": SCHEMA, "kind": kind,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "config": {**config, "versions": versions(), "host": host_facts()},
            "summary": {}}


def _finite(obj: Any) -> Any:
    """JSON has no NaN/Inf: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` then rename ``tmp`` over ``path``; no partial file on failure."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, result: dict[str, Any]) -> Path:
    """Write ``result`` atomically as indented JSON."""
    text = json.dumps(_finite(result), indent=2, allow_nan=False) + "\n"
    return write_atomic(path, lambda tmp: tmp.write_text(text))


def read_table_file(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON or TOML file (by suffix) holding one table/object, with one-line errors that
    name ``what`` it is (``config file``, ``price file``, ...)."""
    import tomllib

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{what} {p}: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{what} {p} is corrupt: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {p} must hold a table/object")
    return data


def check_writable(path: str | Path | None, what: str = "--json") -> Path | None:
    """Fail early, before any work starts, if ``path`` cannot be written."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a directory, not a file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{what} {p}: directory {parent} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".probe", dir=parent)
    except OSError as exc:
        raise ConfigError(f"{what} {p} is not writable: {exc.strerror}") from exc
    os.close(fd)
    os.unlink(probe)
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{what} {p} is not writable")
    return p


def validate_result(doc: dict[str, Any]) -> None:
    """Check the parts of the schema every reader relies on; raise ValueError if absent."""
    for key in ("schema", "kind", "config", "summary"):
        if key not in doc:
            raise ValueError(f"result lacks {key!r}")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"unknown schema {doc['schema']!r}")
    for key in ("versions", "host"):
        if key not in doc["config"]:
            raise ValueError(f"result config lacks {key!r}")
    missing = [k for k in REQUIRED_SUMMARY.get(doc["kind"], ()) if k not in doc["summary"]]
    if missing:
        raise ValueError(f"{doc['kind']} result summary lacks {missing}")
