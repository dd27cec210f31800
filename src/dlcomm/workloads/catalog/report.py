"""``dlcomm workloads show``: the ``workload`` JSON result and its tables.

The JSON schema (kind ``workload``) is documented in docs/workloads.md. Long tables are
shortened by :func:`group_repeated_blocks`: consecutive blocks (``h.0``, ``h.1``, ...)
whose layers agree in everything but their index become one set of rows with a count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dlcomm.results import new_result
from dlcomm.workloads.accelerators import Accelerator
from dlcomm.workloads.catalog.base import Layer, ModelTable
from dlcomm.workloads.catalog.compute import BACKWARD_FACTOR, Bucket, IterationTime

__all__ = ["LayerGroup", "group_repeated_blocks", "workload_result", "print_workload",
           "catalog_rows", "wide_console"]


@dataclass(frozen=True)
class LayerGroup:
    """``count`` consecutive blocks with identical layers; ``layers`` are the first block's."""

    label: str                  # "h.[0-95]" for a repeated block, else the block's own name
    count: int
    layers: tuple[Layer, ...]

    def row_name(self, layer: Layer) -> str:
        """``h.[0-95].attn.qkv`` for a layer of a repeated block, else the layer's name."""
        split = _split(layer.name)
        return self.label + split[2] if self.count > 1 and split else layer.name

    def joins(self, layer: Layer) -> str:
        """The layer's shortcut source, as a pattern for a repeated block: a layer of the
        same block (``h.[0-95].attn.proj``) or ``(block input)``."""
        if self.count == 1 or layer.shortcut_from is None:
            return layer.shortcut_from or ""
        own, other = _split(layer.name), _split(layer.shortcut_from)
        if own and other and own[:2] == other[:2]:
            return self.label + other[2]
        return "(block input)"


def _split(name: str) -> tuple[str, int, str] | None:
    """``"h.11.attn.qkv"`` -> ``("h.", 11, ".attn.qkv")``: the first numeric part of a
    dotted name that has more parts after it, or None."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[:i]) + ".", int(part), "." + ".".join(parts[i + 1:])
    return None


def _signature(layer: Layer, tail: str) -> tuple:
    facts = dataclasses.astuple(layer)[1:-1]     # everything but the name and shortcut
    return (tail, *facts, layer.shortcut_from is not None)


def group_repeated_blocks(layers: tuple[Layer, ...]) -> list[LayerGroup]:
    """Collapse runs of identical consecutive blocks; every layer is in exactly one group.

    1. a block is a maximal run of layers whose names share a prefix up to a numeric part
       (``layer3.4.conv1`` and ``layer3.4.bn1`` form block ``layer3.4``); other layers are
       blocks of one;
    2. consecutive blocks with the same prefix, consecutive indices and the same signature
       (every field but names, and whether a layer joins a shortcut) merge into one group.
    """
    blocks: list[tuple[str | None, int, list[Layer]]] = []
    for layer in layers:
        split = _split(layer.name)
        key = (split[0], split[1]) if split else None
        if key and blocks and blocks[-1][0] == key[0] and blocks[-1][1] == key[1]:
            blocks[-1][2].append(layer)
        else:
            blocks.append((key[0] if key else None, key[1] if key else -1, [layer]))
    groups: list[tuple[str | None, int, int, list[Layer], tuple]] = []
    for prefix, index, members in blocks:
        sig = tuple(_signature(m, _split(m.name)[2] if prefix else m.name) for m in members)
        last = groups[-1] if groups else None
        if (prefix is not None and last is not None and last[0] == prefix
                and last[2] == index - 1 and last[4] == sig):
            groups[-1] = (prefix, last[1], index, last[3], sig)
        else:
            groups.append((prefix, index, index, members, sig))
    out = []
    for prefix, first, last, members, _ in groups:
        count = last - first + 1
        label = f"{prefix}[{first}-{last}]" if count > 1 else (
            f"{prefix}{first}" if prefix is not None else members[0].name)
        out.append(LayerGroup(label, count, tuple(members)))
    return out


def catalog_rows(models: list[ModelTable]) -> list[dict[str, Any]]:
    """One summary row per catalog model (for ``dlcomm workloads list``)."""
    return [{"name": m.name, "family": m.family, "params": m.params,
             "published_params": m.published_params,
             "forward_gflops_per_sample": m.flops_per_sample / 1e9, "sample": m.sample}
            for m in models]


def workload_result(model: ModelTable, accelerator: Accelerator, timing: IterationTime,
                    buckets: tuple[Bucket, ...], config: dict[str, Any]) -> dict[str, Any]:
    """The ``kind: workload`` result (schema in docs/workloads.md)."""
    forward = dict(timing.forward)
    backward = dict(timing.backward)
    batch = timing.batch
    result = new_result("workload", config)
    result["summary"] = {
        "model": model.name, "family": model.family, "sample": model.sample,
        "layers": len(model.layers), "params": model.params,
        "published_params": model.published_params, "params_error": model.params_error,
        "source": model.source,
        "embedding_params": model.embedding_params,
        "sparse_embedding_params": sum(layer.params for layer in model.sparse_layers()),
        "gradient_bytes": model.gradient_bytes(),
        "forward_flops_per_sample": model.flops_per_sample,
        "train_flops_per_iteration": (1 + BACKWARD_FACTOR) * model.flops_per_sample * batch,
        "accelerator": accelerator.name, "peak_flops": accelerator.peak_flops,
        "efficiency": timing.efficiency, "batch": batch, "time_scale": timing.scale,
        "forward_s": timing.forward_s, "backward_s": timing.backward_s,
        "iteration_s": timing.iteration_s,
        "samples_per_s": batch / timing.iteration_s if timing.iteration_s > 0 else None,
        "buckets": len(buckets),
    }
    result["layers"] = [{**dataclasses.asdict(layer), "forward_s": forward[layer.name],
                         "backward_s": backward[layer.name]} for layer in model.layers]
    result["buckets"] = [dataclasses.asdict(b) for b in buckets]
    return result


def _si(n: float, unit: str = "") -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"),
                           (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:.3g}{prefix}{unit}"
    return f"{n:.3g}{unit}"


def _pair(a: str, b: str) -> str:
    return a if a == b else f"{a}>{b}"


def _ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:,.0f}" if ms >= 1000 else f"{ms:.3g}"


def wide_console() -> Any:
    """A rich console; into files and pipes 200 columns wide, so rows stay on one line."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def print_workload(result: dict[str, Any], model: ModelTable, show_all: bool,
                   json_path: str | None = None) -> None:
    """The per-layer table (repeated blocks grouped unless ``show_all``) and the totals."""
    from rich.table import Table

    s = result["summary"]
    per_layer = {row["name"]: row for row in result["layers"]}
    groups = ([LayerGroup(layer.name, 1, (layer,)) for layer in model.layers] if show_all
              else group_repeated_blocks(model.layers))
    table = Table(title=f"{model.name}: {len(model.layers)} layers, per {model.sample}; "
                        f"times at batch {s['batch']} on {s['accelerator']}",
                  title_justify="left")
    table.add_column("layer", no_wrap=True)
    for column, justify in (("kind", "left"), ("x", "right"), ("params", "right"),
                            ("fwd FLOPs", "right"), ("act in>out", "right"),
                            ("c_in>c_out", "right"), ("k", "right"), ("area", "right"),
                            ("joins", "left"), ("fwd+bwd ms", "right")):
        table.add_column(column, justify=justify)
    for group in groups:
        for layer in group.layers:
            row = per_layer[layer.name]
            joins = group.joins(layer)
            table.add_row(group.row_name(layer), layer.kind,
                          str(group.count) if group.count > 1 else "",
                          _si(layer.params), _si(layer.flops),
                          _pair(_si(layer.in_elems), _si(layer.out_elems)),
                          f"{layer.c_in}>{layer.c_out}", str(layer.kernel),
                          _pair(str(layer.area_in), str(layer.area_out)), joins,
                          _ms(row["forward_s"] + row["backward_s"]))
    console = wide_console()
    console.print(table)
    totals = Table(title="totals", title_justify="left", show_header=False)
    totals.add_column("what")
    totals.add_column("value")
    scaled = (f" (scaled x{s['time_scale']:.3g} to the measured time)"
              if s["time_scale"] != 1.0 else "")
    rows = [
        ("parameters", f"{s['params']:,} (published {_si(s['published_params'])}, "
                       f"{s['params_error']:+.2%})"),
        ("published count", s["source"]),
        ("gradient (fp32)", _si(s["gradient_bytes"], "B")),
        ("sparse embedding parameters", f"{s['sparse_embedding_params']:,}"),
        ("forward FLOPs per sample", _si(s["forward_flops_per_sample"])),
        ("training FLOPs per iteration", _si(s["train_flops_per_iteration"])),
        ("accelerator", f"{s['accelerator']}: {_si(s['peak_flops'], 'FLOP/s')} peak x "
                        f"{s['efficiency']:.2f} efficiency"),
        ("batch (samples per accelerator)", str(s["batch"])),
        ("forward / backward", f"{_ms(s['forward_s'])} ms / {_ms(s['backward_s'])} ms{scaled}"),
        ("iteration", f"{_ms(s['iteration_s'])} ms"),
        ("samples per second", f"{s['samples_per_s']:,.4g}" if s["samples_per_s"] else "-"),
        ("gradient buckets", f"{s['buckets']} (cap "
                             f"{result['config']['bucket_cap_bytes'] / 2**20:g} MiB)"),
    ]
    for label, value in rows:
        totals.add_row(label, value)
    if json_path:
        totals.caption = f"JSON result: {json_path}"
    console.print(totals)
