"""Registries (name -> factory) and the ``name:key=value,...`` spec syntax.

Every pluggable piece of dlcomm (workloads, exchanges, later compressors, topologies and
sync protocols) is looked up by name in a :class:`Registry`. A spec string selects an entry
and passes keyword options: ``synthetic:tensors=4,numel=1M``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dlcomm.errors import ConfigError, RegistryError

__all__ = ["Registry", "Spec", "parse_spec", "split_specs", "parse_size", "parse_rate",
           "take_option", "reject_unknown"]

T = TypeVar("T")

_SIZE_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
               "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


@dataclass(frozen=True)
class Spec:
    """A parsed ``name:key=value,...`` string. Values stay strings; factories convert."""

    name: str
    options: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.options.items())


def parse_spec(text: str) -> Spec:
    """Parse ``name`` or ``name:k=v,k2=v2`` into a :class:`Spec`."""
    name, _, rest = text.strip().partition(":")
    if not name:
        raise ConfigError(f"empty name in spec {text!r}")
    options: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"bad option {item!r} in spec {text!r} (expected key=value)")
        options[key.strip()] = value.strip()
    return Spec(name, options)


def split_specs(text: str) -> list[str]:
    """Split ``ring,switch:k=256,window=64`` into ``["ring", "switch:k=256,window=64"]``.

    A comma starts a new spec unless what follows is a ``key=value`` option of the
    previous spec.
    """
    specs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if specs and "=" in part and ":" in specs[-1] and ":" not in part.split("=")[0]:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


_KINDS: dict[Any, str] = {int: "an integer", float: "a number"}


def take_option(options: dict[str, str], key: str, convert: Callable[[str], T], default: T,
                owner: str, check: Callable[[T], bool] | None = None, want: str = "") -> T:
    """Pop ``key`` from a spec's ``options`` and convert it (``default`` if absent).

    ``owner`` names the spec in errors (``compressor 'topk'``, ``workload 'synthetic'``);
    a value that does not convert, or fails ``check``, is a one-line ConfigError that says
    what was wanted (``want``, else the converter's kind or its own error).
    """
    if key not in options:
        return default
    text = options.pop(key)
    try:
        value = convert(text)
    except (ValueError, ConfigError) as exc:
        detail = want or _KINDS.get(convert) or str(exc)
        raise ConfigError(f"{owner}: bad value {key}={text!r}" + (f" ({detail})" if detail
                                                                   else "")) from None
    if check is not None and not check(value):
        raise ConfigError(f"{owner}: {key}={text} is out of range" + (f" ({want})" if want
                                                                       else ""))
    return value


def reject_unknown(options: dict[str, str], owner: str, known: Iterable[str] = ()) -> None:
    """A one-line ConfigError if any option is left over (not taken by the factory)."""
    if options:
        names = ", ".join(known)
        raise ConfigError(f"{owner} has no option(s) {sorted(options)}"
                          + (f" (known: {names})" if names else ""))


def parse_size(text: str | int) -> int:
    """Parse a count or byte size: ``100MB``, ``1M``, ``4KiB``, ``2.5G``, ``1000``."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?[iI]?)[bB]?\s*", text)
    if not m:
        raise ConfigError(f"bad size {text!r} (examples: 1000, 4K, 100MB, 1GiB)")
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]
    if value != int(value):
        raise ConfigError(f"size {text!r} is not a whole number")
    return int(value)


def parse_rate(text: str) -> float:
    """Parse a link rate in bits per second: ``100mbit``, ``1gbit``, ``10Gbit``, ``500kbit``."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bit|bps)?\s*", text.lower())
    if not m:
        raise ConfigError(f"bad rate {text!r} (examples: 100mbit, 1gbit, 10gbit)")
    if not m.group(2) and not m.group(3):  # "10": 10 bit/s is never what was meant
        raise ConfigError(f"rate {text!r} has no unit (examples: 100mbit, 1gbit, 10gbit; "
                          f"{text.strip()}bit for bits per second)")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]


class Registry(Generic[T]):
    """A named collection of factories with a clear error for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}
        self._docs: dict[str, str] = {}

    def register(self, name: str, doc: str = "") -> Callable[[Callable[..., T]], Callable[..., T]]:
        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._factories[name] = factory
            self._docs[name] = doc or (factory.__doc__ or "").strip().splitlines()[0]
            return factory
        return decorator

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._factories[name]
        except KeyError:
            known = ", ".join(sorted(self._factories)) or "none"
            raise RegistryError(f"unknown {self.kind} {name!r} (known: {known})") from None

    def check(self, spec: str | Spec) -> Spec:
        """Parse ``spec`` and check that its name is registered."""
        parsed = spec if isinstance(spec, Spec) else parse_spec(spec)
        self.get(parsed.name)
        return parsed

    def doc(self, name: str) -> str:
        self.get(name)
        return self._docs[name]

    def names(self) -> list[str]:
        return sorted(self._factories)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._factories
