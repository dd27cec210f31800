"""Options of a training job, from defaults, a config file (JSON or TOML) and the CLI.

Later sources override earlier ones: dataclass defaults < ``--config FILE`` < command line.
Everything is validated here, before any process starts, so bad input costs one line.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlcomm.errors import ConfigError

__all__ = ["TrainConfig", "load_config_file", "parse_fault", "Fault"]


@dataclass(frozen=True)
class TrainConfig:
    workload: str = "digits-cnn"      # workload spec, e.g. "synthetic:tensors=4,numel=1M"
    workers: int = 4                  # worker processes (local launcher)
    exchange: str = "ring"            # gradient exchange spec
    epochs: int | None = None         # passes over the training set (default: the workload's)
    steps: int | None = None          # stop after this many steps (caps epochs)
    batch_size: int | None = None     # examples per worker per step (default: the workload's)
    lr: float | None = None           # learning rate (default: the workload's)
    seed: int = 0                     # model init, data order and synthetic data
    eval_every: int = 0               # evaluate every N steps; 0 = at the end of each epoch
    json: str | None = None           # write the JSON result here
    plot: str | None = None           # write a PNG of loss/metric over steps and time here
    master_addr: str = "127.0.0.1"    # env:// rendezvous address
    master_port: int = 0              # env:// rendezvous port; 0 = pick a free one
    timeout_s: float = 120.0          # deadline of collectives and exchanges
    threads: int = 0                  # torch threads per worker; 0 = cores / local workers
    network: str = "loopback"         # where workers run: "loopback" or "emulated"
    bandwidth: str | None = None      # emulated link rate, e.g. "1gbit"
    topology: str = "star"            # emulated topology: star | leafspine:RACKS:HOSTS:OVERSUB
    cluster: str | None = None        # an emulated cluster made by `dlcomm cluster up`
    compress: str = "none"            # gradient compression spec (dlcomm.compress)
    memory: str = "none"              # error-feedback memory spec for --compress
    sync: str = "bsp"                 # how workers agree on a model: bsp | hop:... | prague:...
    backend: str = "gloo"             # the workers' process group: gloo (--exchange through a
                                      # DDP hook) | dlcomm (--exchange as the c10d backend)
    straggler: str | None = None      # "RANK:FACTOR" or "random:p=P,x=FACTOR" (slower compute)
    compute_ms: float = 0.0           # emulated compute time per step, added to the real one
    quiet: bool = False               # no progress bar or table
    fault: str | None = None          # fault injection for tests: "RANK:STEP:raise|exit|kill|hang"
    extra: dict[str, Any] = field(default_factory=dict)  # options of later layers

    def __post_init__(self) -> None:
        for name in ("workers", "epochs", "steps", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if not 0 < self.timeout_s < float("inf"):
            raise ConfigError(f"--timeout-s must be a finite number > 0, got {self.timeout_s}")
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"--master-port must be in 0..65535, got {self.master_port}")
        if self.eval_every < 0 or self.threads < 0:
            raise ConfigError("--eval-every and --threads must be >= 0")
        if self.fault is not None:
            parse_fault(self.fault)
        if self.compute_ms < 0:
            raise ConfigError(f"--compute-ms must be >= 0, got {self.compute_ms}")
        if self.straggler is not None:
            from dlcomm.train.hetero import parse_straggler
            parse_straggler(self.straggler)
        decentralized = self.sync.split(":", 1)[0] != "bsp"
        if decentralized and (self.compress != "none" or self.memory != "none"):
            raise ConfigError(f"--compress/--memory apply to --sync bsp only, not {self.sync}")
        if self.backend not in ("gloo", "dlcomm"):
            raise ConfigError(f"--backend must be gloo or dlcomm, got {self.backend!r}")
        if self.backend == "dlcomm" and (decentralized or self.compress != "none"):
            raise ConfigError("--backend dlcomm takes --sync bsp and no --compress (name a "
                              "compressed exchange instead: --exchange compressed:...)")

    @classmethod
    def from_sources(cls, file_values: dict[str, Any] | None = None,
                     cli_values: dict[str, Any] | None = None) -> TrainConfig:
        """Merge defaults, a config file's values and explicit CLI values; validate types."""
        merged: dict[str, Any] = {}
        for source, values in (("config file", file_values or {}), ("options", cli_values or {})):
            for key, value in values.items():
                if value is None and source == "options":
                    continue
                merged[key.replace("-", "_")] = _checked(key.replace("-", "_"), value, source)
        return cls(**merged)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _allowed_types(annotation: Any) -> tuple[type, ...]:
    hint = eval(annotation, {"Any": Any, "dict": dict}) if isinstance(annotation, str) \
        else annotation
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(typing.get_origin(a) or a for a in typing.get_args(hint))
    return (typing.get_origin(hint) or hint,)


def _checked(key: str, value: Any, source: str) -> Any:
    if key not in _FIELDS:
        raise ConfigError(f"{source}: unknown option {key!r}")
    allowed = _allowed_types(_FIELDS[key].type)
    if value is None and type(None) in allowed:
        return None
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and bool not in allowed:
        raise ConfigError(f"{source}: option {key!r} must be {_names(allowed)}, got {value!r}")
    if not isinstance(value, allowed):
        raise ConfigError(f"{source}: option {key!r} must be {_names(allowed)}, got {value!r}")
    return value


def _names(types_: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types_ if t is not type(None))


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or TOML config file into a dict, with a one-line error if it is bad."""
    from dlcomm.results import read_table_file

    return read_table_file(path, "config file")


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str  # raise | exit | kill | hang


def parse_fault(text: str) -> Fault:
    """``RANK:STEP:KIND``: at step STEP, worker RANK raises / exits 3 / SIGKILLs itself / hangs."""
    parts = text.split(":")
    if len(parts) != 3 or parts[2] not in ("raise", "exit", "kill", "hang"):
        raise ConfigError(f"bad --fault {text!r} (expected RANK:STEP:raise|exit|kill|hang)")
    try:
        return Fault(int(parts[0]), int(parts[1]), parts[2])
    except ValueError:
        raise ConfigError(f"bad --fault {text!r} (RANK and STEP are integers)") from None
