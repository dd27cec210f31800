"""Collective calls on the simulated network: algorithm choice, exchanges, calibration.

A :class:`Call` is what one collective of one iteration costs, in pieces the event-driven
schedule can share fairly with other traffic: a fixed time first (an exchange's measured
per-call overhead, compression and decompression), then its phases one after another,
each a latency (steps x (alpha + hops x per-hop latency)) followed by a transfer of
``nbytes`` per weight-1 flow on its pattern (``dlcomm.plan.simulate.fluid``).

:class:`Collectives` builds calls for a grid of ranks DP x PP x TP (+EP):

1. groups: the rows of ``dlcomm.plan.commtime.group_ranks`` whose members belong to the
   asked pipeline stage; all of them run the call at once;
2. host-based all-reduce (the ``ring`` exchange, TP and expert all-reduces): the named
   algorithm, or the fastest alone on the network among ring, tree, halving-doubling,
   doubling, torus rings and hierarchical (``--algorithm best``), chosen on stage 0's
   groups per message size and then used on every stage (stages are translates of each
   other under linear placement); torus rings follow the grid the group's accelerators
   form on a torus or HammingMesh, where they form one;
3. DP gradients go through the exchange (:class:`ExchangeModel`): ``ring`` as 2;
   ``switch`` = in-network aggregation (T ~ n / B); ``sparse-switch`` = aggregation of
   the non-zero blocks only (OmniReduce): each worker streams its density d of the
   blocks, the switch returns their union (d for a pattern shared by all workers,
   1 - (1 - d)^g for independent ones); ``auto`` = sparse below the auto exchange's union
   density threshold, else dense; compression (:class:`CompressionModel`) shrinks what the
   inner exchange moves (summable methods) or turns it into a ring all-gather of every
   worker's payload (the others), and adds compression time;
4. a calibration (from ``dlcomm bench allreduce``, ``dlcomm.bench.calibrate``) turns
   the ideal network time t of an exchange into ``overhead + efficiency x t``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.exchange.switch import auto_sparse_below  # the auto exchange's own threshold
from dlcomm.plan.commtime import group_ranks
from dlcomm.plan.simulate.algorithms import (
    allgather_phases,
    allreduce_phases,
    alltoall_phases,
    grid_shape,
    hierarchy_sizes,
    ina_phases,
)
from dlcomm.plan.simulate.fluid import SimNetwork
from dlcomm.plan.traffic import Parallelism
from dlcomm.registry import parse_spec

__all__ = ["Step", "Call", "CompressionModel", "ExchangeModel", "Collectives",
           "EXCHANGE_KINDS", "host_candidates", "parse_exchange", "auto_sparse_below",
           "measure_compression"]

EXCHANGE_KINDS = ("ring", "switch", "sparse-switch", "auto")


@dataclass(frozen=True)
class Step:
    pattern: Hashable
    nbytes: float          # bytes of a weight-1 flow over the phase
    latency_s: float


@dataclass(frozen=True)
class Call:
    dim: str               # dp | dp-expert | tp | pp | ep | embedding
    stage: int
    op: str                # allreduce | alltoall | allgather | p2p
    algorithm: str
    nbytes: float          # message per rank
    steps: tuple[Step, ...]
    fixed_s: float = 0.0   # before the network: overhead, compression

    def alone_s(self, net: SimNetwork) -> float:
        """Time of the call with the network to itself."""
        return self.fixed_s + sum(s.latency_s + (s.nbytes / net.patterns[s.pattern].rate_Bps
                                                  if s.nbytes else 0.0) for s in self.steps)


@dataclass(frozen=True)
class CompressionModel:
    """What a compressor does to a gradient bucket, for the simulator.

    ``ratio``: wire bytes / float32 bytes of the bucket, measured by running dlcomm's own
    compressor (``dlcomm.compress``) on a random tensor; ``summable``: payloads add (they
    go through the inner exchange), else they are all-gathered; ``gbps``: GB/s of dense
    float32 data the accelerator compresses and decompresses (one pass each, plus one per
    gathered payload to decompress)."""

    spec: str
    ratio: float
    summable: bool
    gbps: float
    source: str = "measured"

    def compute_s(self, dense_fp32_bytes: float, group: int) -> float:
        gathered = 0.0 if self.summable else group * self.ratio * dense_fp32_bytes
        return (2 * dense_fp32_bytes + gathered) / (self.gbps * 1e9)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_compression(spec: str, world: int, native: bool, gbps: float,
                        ratio: float | None = None, sample: int = 2**18) -> CompressionModel:
    """Run dlcomm's compressor ``spec`` once on ``sample`` standard-normal elements and
    take its wire bytes per float32 byte (``ratio`` overrides the measurement)."""
    import torch

    from dlcomm.compress import make_compressor, run_local
    from dlcomm.compress.api import wire_bytes

    if gbps <= 0:
        raise ConfigError(f"--compress-gbps must be > 0, got {gbps}")
    if parse_spec(spec).name == "adaptive":
        raise ConfigError("compressor 'adaptive' decides at run time; simulate its choices "
                          "one by one (e.g. --compress fp16, powersgd, topk:ratio=0.01)")
    compressor = make_compressor(spec)
    if ratio is not None:
        if not ratio > 0:
            raise ConfigError(f"--compress-ratio must be > 0, got {ratio}")
        return CompressionModel(spec, ratio, compressor.summable, gbps, "given")
    x = torch.randn(sample, generator=torch.Generator().manual_seed(0))
    _, payload = run_local(compressor, x)
    measured = wire_bytes(compressor, payload, world, native) / (4 * sample)
    return CompressionModel(spec, measured, compressor.summable, gbps)


@dataclass(frozen=True)
class ExchangeModel:
    """How DP gradients are summed (module docstring, step 3)."""

    kind: str = "ring"                 # ring | switch | sparse-switch | auto
    density: float = 1.0               # sparse: fraction of non-zero blocks per worker
    pattern: str = "shared"            # sparse: shared | independent block patterns
    compression: CompressionModel | None = None
    overhead_s: float = 0.0            # calibration: fixed seconds per call
    efficiency: float = 1.0            # calibration: measured / modelled network time
    calibrated: bool = False

    def __post_init__(self) -> None:
        if self.kind not in EXCHANGE_KINDS:
            raise ConfigError(f"unknown exchange {self.kind!r} for the simulator "
                              f"(known: {', '.join(EXCHANGE_KINDS)}, compressed:...)")
        if not 0 < self.density <= 1:
            raise ConfigError(f"--density must be in (0, 1], got {self.density}")
        if self.pattern not in ("shared", "independent"):
            raise ConfigError(f"sparse pattern must be shared or independent, got "
                              f"{self.pattern!r}")
        if self.overhead_s < 0 or not self.efficiency > 0:
            raise ConfigError("calibration needs overhead >= 0 and efficiency > 0")

    @property
    def label(self) -> str:
        base = self.kind
        if self.kind in ("sparse-switch", "auto") and self.density < 1:
            base += f"(density={self.density:g})"
        if self.compression:
            base = f"{self.compression.spec} over {base}"
        return base

    def union_density(self, group: int) -> float:
        if self.pattern == "shared":
            return self.density
        return 1 - (1 - self.density) ** group

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["compression"] = self.compression.to_dict() if self.compression else None
        out["label"] = self.label
        return out


def parse_exchange(spec: str) -> tuple[str, str | None]:
    """(inner exchange kind, compressor spec or None) of ``ring``, ``switch``,
    ``sparse-switch``, ``auto`` or ``compressed:method=M[,opts][,over=K][,memory=..]``."""
    parsed = parse_spec(spec)
    if parsed.name != "compressed":
        if parsed.options:
            raise ConfigError(f"the simulator's exchange {parsed.name!r} takes no options "
                              f"(density: --density)")
        if parsed.name not in EXCHANGE_KINDS:
            raise ConfigError(f"unknown exchange {parsed.name!r} for the simulator (known: "
                              f"{', '.join(EXCHANGE_KINDS)}, compressed:method=...)")
        return parsed.name, None
    opts = dict(parsed.options)
    method = opts.pop("method", None)
    if not method:
        raise ConfigError("exchange 'compressed' needs method=NAME (e.g. method=topk,ratio=0.01)")
    over = opts.pop("over", "ring")
    opts.pop("memory", None)          # error feedback changes accuracy, not time
    if over not in EXCHANGE_KINDS:
        raise ConfigError(f"compressed over {over!r}: the simulator knows "
                          f"{', '.join(EXCHANGE_KINDS)}")
    return over, str(type(parsed)(method, opts))


def host_candidates(g: int, grid: bool = False) -> list[str]:
    """Host-based all-reduce algorithms that apply to a group of ``g`` (``grid``: its
    members form a grid of at least 2 x 2 on the topology)."""
    if g < 2:
        return []
    names = ["ring", "tree"]
    if g & (g - 1) == 0:
        names += ["halving-doubling", "doubling"]
    if grid or grid_shape(g)[0] >= 2:
        names.append("torus")
    names += [f"hierarchical:{h}" for h in hierarchy_sizes(g)]
    names += [f"rails:{h}" for h in hierarchy_sizes(g)]
    return names


@dataclass
class Collectives:
    """Calls of one simulated iteration (module docstring)."""

    net: SimNetwork
    par: Parallelism
    exchange: ExchangeModel = field(default_factory=ExchangeModel)
    algorithm: str = "best"
    alpha_s: float = 1e-6
    hop_latency_s: float = 0.0
    _groups: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    _choice: dict[tuple[str, float], str] = field(default_factory=dict)
    _layouts: dict[str, np.ndarray | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.alpha_s < 0 or self.hop_latency_s < 0:
            raise ConfigError("latencies must be >= 0")
        if self.algorithm != "best":
            base = self.algorithm.split(":")[0]
            if base not in ("ring", "tree", "halving-doubling", "doubling", "torus",
                            "hierarchical", "rails", "nccl"):
                raise ConfigError(f"unknown --algorithm {self.algorithm!r} (best, nccl, ring, "
                                  "tree, halving-doubling, doubling, torus, hierarchical[:H], "
                                  "rails[:H])")

    # -- groups --------------------------------------------------------------------------
    def groups(self, dim: str, stage: int) -> np.ndarray:
        """Rows of ranks of ``dim``'s groups inside pipeline stage ``stage``."""
        key = (dim, stage)
        if key not in self._groups:
            rows = group_ranks(self.par, dim)
            of_stage = (rows[:, 0] // self.par.tp) % self.par.pp == stage
            self._groups[key] = rows[of_stage]
        return self._groups[key]

    def layout(self, dim: str) -> np.ndarray | None:
        """Member indices of ``dim``'s groups arranged as the grid their accelerators form
        on a torus or mesh (taken from stage 0's first group; groups of other stages and
        replicas are translates of it under linear placement), or None."""
        if dim not in self._layouts:
            self._layouts[dim] = None
            coords = self.net.grid_coords()
            if coords is not None:
                members = coords[self.net.node[self.groups(dim, 0)[0]]]
                values = [np.unique(members[:, ax]) for ax in range(members.shape[1])]
                shape = tuple(len(v) for v in values)
                if int(np.prod(shape)) == len(members) and sum(n > 1 for n in shape) >= 2:
                    at = tuple(np.searchsorted(values[ax], members[:, ax])
                               for ax in range(members.shape[1]))
                    grid = np.full(shape, -1)
                    grid[at] = np.arange(len(members))
                    if (grid >= 0).all():
                        self._layouts[dim] = grid
        return self._layouts[dim]

    def _phases(self, dim: str, name: str, g: int) -> list[Any]:
        return allreduce_phases(name, g, self.layout(dim) if name == "torus" else None)

    def _steps(self, scope: Hashable, groups: np.ndarray, phases: list[Any], nbytes: float,
               scale: float = 1.0) -> tuple[Step, ...]:
        out = []
        for ph in phases:
            pattern = self.net.phase(scope, groups, ph)
            latency = ph.steps * (self.alpha_s + pattern.hops * self.hop_latency_s)
            out.append(Step(pattern.key, ph.fraction * nbytes * scale, latency))
        return tuple(out)

    # -- host-based all-reduce -------------------------------------------------------------
    def _alone(self, steps: tuple[Step, ...]) -> float:
        return sum(s.latency_s + s.nbytes / self.net.patterns[s.pattern].rate_Bps
                   for s in steps)

    def best_algorithm(self, dim: str, nbytes: float) -> str:
        """The fastest host-based all-reduce alone on stage 0's groups of ``dim``."""
        key = (dim, nbytes)
        if key not in self._choice:
            groups = self.groups(dim, 0)
            g = groups.shape[1]
            grid = self.layout(dim) is not None
            times = {name: self._alone(self._steps((dim, 0), groups,
                                                   self._phases(dim, name, g), nbytes))
                     for name in host_candidates(g, grid)}
            self._choice[key] = min(times, key=lambda n: times[n])
        return self._choice[key]

    def nccl_algorithm(self, dim: str) -> str:
        """NCCL's rings for stage 0's groups of ``dim``: on servers (``nodes``) with h > 1
        members in each of several nodes ``rails:h``, else one ring."""
        groups = self.groups(dim, 0)
        per_node = getattr(getattr(self.net.topology, "node", None), "gpus", 0)
        if not per_node or groups.shape[1] < 2:
            return "ring"
        nodes = len(np.unique(self.net.where[groups[0]] // per_node))
        h = groups.shape[1] // nodes
        return f"rails:{h}" if nodes > 1 and h > 1 and h * nodes == groups.shape[1] else "ring"

    def allreduce(self, dim: str, stage: int, nbytes: float, scale: float = 1.0,
                  fixed_s: float = 0.0) -> Call:
        groups = self.groups(dim, stage)
        g = groups.shape[1]
        name = self.best_algorithm(dim, nbytes) if self.algorithm == "best" else \
            self.nccl_algorithm(dim) if self.algorithm == "nccl" else self.algorithm
        if g < 2:
            return Call(dim, stage, "allreduce", "none", nbytes, (), fixed_s)
        steps = self._steps((dim, stage), groups, self._phases(dim, name, g), nbytes, scale)
        return Call(dim, stage, "allreduce", name, nbytes, steps, fixed_s)

    def alltoall(self, dim: str, stage: int, nbytes: float) -> Call:
        groups = self.groups(dim, stage)
        phases = alltoall_phases(groups.shape[1], len(groups))
        return Call(dim, stage, "alltoall", "pairwise", nbytes,
                    self._steps((dim, stage), groups, phases, nbytes))

    def p2p(self, stage: int, forward: bool, nbytes: float) -> Call:
        """Every rank of stage ``stage`` sends to its peer in stage+1 (forward), or back;
        the last stage's next is the first (the interleaved schedule's next model chunk)."""
        idx = np.arange(self.par.world).reshape(self.par.dp, self.par.pp, self.par.tp)
        a, b = idx[:, stage].ravel(), idx[:, (stage + 1) % self.par.pp].ravel()
        src, dst = (a, b) if forward else (b, a)
        key = ("pp", stage, "fwd" if forward else "bwd")
        pattern = self.net.flows(key, src, dst)
        step = Step(key, nbytes, self.alpha_s + pattern.hops * self.hop_latency_s)
        return Call("pp", stage, "p2p", "p2p", nbytes, (step,))

    # -- gradients through the exchange ---------------------------------------------------
    def gradients(self, dim: str, stage: int, nbytes: float) -> Call:
        """The DP all-reduce of one gradient bucket of ``nbytes`` through the exchange."""
        ex = self.exchange
        groups = self.groups(dim, stage)
        g = groups.shape[1]
        if g < 2:
            return Call(dim, stage, "allreduce", "none", nbytes, ())
        fixed = ex.overhead_s
        wire = nbytes
        comp = ex.compression
        if comp is not None:
            dense32 = nbytes / self.par.bytes * 4
            fixed += comp.compute_s(dense32, g)
            wire = comp.ratio * dense32
            if not comp.summable:
                steps = self._steps((dim, stage), groups, allgather_phases(g), wire,
                                    ex.efficiency)
                return Call(dim, stage, "allgather", f"{comp.spec}: ring all-gather",
                            nbytes, steps, fixed)
        if ex.kind == "ring":
            call = self.allreduce(dim, stage, wire, ex.efficiency, fixed)
            return replace(call, nbytes=nbytes, algorithm=self._label(call.algorithm))
        up, down, how = 1.0, 1.0, "ina"
        union = ex.union_density(g)
        if ex.kind == "sparse-switch" or (ex.kind == "auto" and union < auto_sparse_below(g)):
            up, down, how = ex.density, union, "sparse ina"
        steps = self._steps((dim, stage), groups, ina_phases(g, up, down), wire, ex.efficiency)
        return Call(dim, stage, "allreduce", self._label(how), nbytes, steps, fixed)

    def _label(self, algorithm: str) -> str:
        comp = self.exchange.compression
        return f"{comp.spec}: {algorithm}" if comp else algorithm

