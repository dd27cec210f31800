"""Network cost: every price an explicit constant with its source, overridable from a file.

All prices are US dollars for 400 Gb/s-class parts (one port, one cable, one link).
None of them is a quoted list price: the HammingMesh paper's prices are marked
unverified in docs/references.md (HammingMesh), and street prices move by 2x within a year, so
every default below is marked *unverified* with the reasoning behind it. Ratios between
topologies (what the planner compares) depend on the ratios between these prices; rerun
with ``--prices FILE`` to use your own quotes::

    # prices.toml (or the same keys in a JSON object; a [prices] table also works)
    switch_port = 650.0
    aoc = 1100.0

What is charged (``network_cost``):

- ``switch_port`` per switch port *used* (cabled); partly filled switches are assumed
  packed (e.g. two 32-endpoint row trees on one 64-port switch);
- ``dac`` per electrical direct-attach cable (short, inside a rack), ``aoc`` per active
  optical cable (long, between racks);
- ``nic_port`` per accelerator port that drives a cable (a NIC or the retimer/SerDes
  cage of an integrated port); ports wired in board traces need none;
- ``board_trace`` per accelerator-accelerator link routed on a board.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan.topology.base import Counts
from dlcomm.results import read_table_file

__all__ = ["Prices", "SOURCES", "load_prices", "Cost", "network_cost"]


@dataclass(frozen=True)
class Prices:
    switch_port: float = 700.0     # USD per 400G switch port
    dac: float = 200.0             # USD per 400G passive copper cable (<= 3 m)
    aoc: float = 900.0             # USD per 400G active optical cable
    nic_port: float = 1600.0       # USD per 400G accelerator network port on a cable
    board_trace: float = 10.0      # USD per on-board accelerator-accelerator link


SOURCES: dict[str, str] = {
    "switch_port": "unverified: a 64 x 400G switch (25.6 Tb/s ASIC class) at roughly "
                   "$40-50k, i.e. ~$700 per port; the HammingMesh paper prices switch "
                   "ports too, with figures docs/references.md marks unverified",
    "dac": "unverified: 400G QSFP-DD passive DAC of 1-3 m at ~$150-250 from third-party "
           "optics vendors' catalogues",
    "aoc": "unverified: 400G QSFP-DD active optical cable of 10-30 m at ~$700-1100 from "
           "third-party optics vendors' catalogues (about 4x a DAC)",
    "nic_port": "unverified: a single-port 400G NIC (ConnectX-7 class) at ~$1,500-2,000",
    "board_trace": "unverified: the marginal PCB cost of one board-level 400G channel; "
                   "near zero, as in the HammingMesh argument",
}


def load_prices(path: str | Path | None) -> Prices:
    """Defaults, with the keys of a JSON or TOML file (top level or a ``prices`` table)."""
    if path is None:
        return Prices()
    p = Path(path)
    data = read_table_file(p, "price file")
    if isinstance(data.get("prices"), dict):
        data = data["prices"]
    known = {f.name for f in fields(Prices)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"price file {p}: unknown price {unknown[0]!r} "
                          f"(known: {', '.join(sorted(known))})")
    values = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise ConfigError(f"price file {p}: {key} must be a number >= 0, got {value!r}")
        values[key] = float(value)
    return Prices(**values)


@dataclass(frozen=True)
class Cost:
    items: dict[str, dict[str, float]]     # name -> {count, unit_usd, usd}
    total: float
    per_accelerator: float

    def to_dict(self) -> dict[str, Any]:
        return {"total_usd": self.total, "per_accelerator_usd": self.per_accelerator,
                "items": self.items}


def network_cost(counts: Counts, prices: Prices) -> Cost:
    """The network's cost: the parts of ``counts`` at ``prices`` (module docstring)."""
    lines = {"switch_port": counts.switch_ports_used, "dac": counts.cables.get("dac", 0),
             "aoc": counts.cables.get("aoc", 0), "nic_port": counts.nic_ports,
             "board_trace": counts.trace_links}
    unit = asdict(prices)
    items = {k: {"count": n, "unit_usd": unit[k], "usd": n * unit[k]} for k, n in lines.items()}
    total = sum(i["usd"] for i in items.values())
    return Cost(items, total, total / counts.accelerators)
