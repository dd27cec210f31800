"""The ``--sync`` specs of the decentralized protocols, parsed and checked before any
training starts, and the registry that runs them.

    hop:graph=ring|torus|exp|complete|bipartite|edges,rows=R,edges=0-1+1-2,
        max_gap=4,backup=0,staleness=3,skip=1,reuse=0   (the defaults)
    prague:group_size=4,generator=buffer|random|static,impl=dist|switch,window_ms=auto
    adpsgd:graph=ring|bipartite|torus|edges,...

Keys may be written with dashes (``max-gap``); unknown keys are errors.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from dlcomm.errors import ConfigError
from dlcomm.registry import Registry, Spec, parse_spec
from dlcomm.train.config import TrainConfig
from dlcomm.train.runtime import WorkerEnv
from dlcomm.train.sync.adpsgd import split_roles
from dlcomm.train.sync.graphs import GRAPHS, Graph, make_graph
from dlcomm.train.sync.hop import HopOptions
from dlcomm.train.sync.local import Learner, Recorder
from dlcomm.train.sync.prague import GENERATORS, PragueSpec

__all__ = ["Protocol", "SYNCS", "parse_sync", "Hop", "Prague", "ADPSGD"]


class Protocol(abc.ABC):
    """A decentralized protocol with its options, ready to run on one worker."""

    name = "protocol"

    @abc.abstractmethod
    def run(self, cfg: TrainConfig, env: WorkerEnv, learner: Learner,
            recorder: Recorder) -> int:
        """Train this worker until the run ends; returns the protocol's iteration count.
        Must call ``recorder.start_together(learner)`` once its set-up is done."""

    @abc.abstractmethod
    def check(self, world: int) -> None:
        """Raise ConfigError if the options cannot work with ``world`` workers."""


SYNCS: Registry[Protocol] = Registry("sync protocol")


def _int(options: dict[str, str], key: str, default: int, protocol: str) -> int:
    text = options.pop(key, None)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{protocol}: {key} must be an integer, got {text!r}") from None


def _no_more(options: dict[str, str], protocol: str, known: str) -> None:
    if options:
        raise ConfigError(f"{protocol}: unknown option(s) {', '.join(sorted(options))} "
                          f"(known: {known})")


@dataclass(frozen=True)
class _GraphChoice:
    name: str = "ring"
    options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def take(cls, options: dict[str, str], default: str) -> "_GraphChoice":
        name = options.pop("graph", default)
        extra = {k: options.pop(k) for k in ("rows", "edges") if k in options}
        GRAPHS.get(name)
        return cls(name, extra)

    def build(self, world: int) -> Graph:
        return make_graph(self.name, world, **self.options)


@SYNCS.register("hop", "Hop: queues and tokens bound the iteration gap; backup, staleness, skip")
class Hop(Protocol):
    name = "hop"

    def __init__(self, **options: str) -> None:
        opts = dict(options)
        self.graph = _GraphChoice.take(opts, "ring")
        d = HopOptions()  # the defaults tolerate a straggler (hop.py, "Defaults")
        self.options = HopOptions(max_gap=_int(opts, "max_gap", d.max_gap, "hop"),
                                  backup=_int(opts, "backup", d.backup, "hop"),
                                  staleness=_int(opts, "staleness", d.staleness, "hop"),
                                  skip=_int(opts, "skip", d.skip, "hop"),
                                  reuse=_int(opts, "reuse", d.reuse, "hop"))
        _no_more(opts, "hop", "graph, rows, edges, max_gap, backup, staleness, skip, reuse")

    def check(self, world: int) -> None:
        graph = self.graph.build(world)
        degree = min(len(graph.in_neighbours(r)) for r in range(world))
        if self.options.backup >= degree:
            raise ConfigError(f"hop: backup={self.options.backup} must be below the in-degree "
                              f"of every worker ({degree} on {graph.name} with {world} workers)")

    def run(self, cfg: TrainConfig, env: WorkerEnv, learner: Learner,
            recorder: Recorder) -> int:
        from dlcomm.train.sync.run_hop import run_hop
        return run_hop(cfg, env, learner, recorder, self.graph.build(env.world_size),
                       self.options)


@SYNCS.register("prague", "Prague: partial all-reduce in groups from a group generator")
class Prague(Protocol):
    name = "prague"

    def __init__(self, **options: str) -> None:
        opts = dict(options)
        generator = opts.pop("generator", "buffer")
        GENERATORS.get(generator)
        impl = opts.pop("impl", "dist")
        if impl not in ("dist", "switch"):
            raise ConfigError(f"prague: impl must be dist or switch, got {impl!r}")
        if impl == "switch" and generator != "static":
            raise ConfigError("prague: impl=switch registers one switch job per group at "
                              "start, so it needs generator=static (the groups known ahead)")
        window = opts.pop("window_ms", "auto")
        try:
            window_ms = None if window == "auto" else float(window)
        except ValueError:
            raise ConfigError(f"prague: window_ms must be a number or auto, got {window!r}") from None
        if window_ms is not None and window_ms < 0:
            raise ConfigError(f"prague: window_ms must be >= 0, got {window_ms:g}")
        self.spec = PragueSpec(_int(opts, "group_size", 4, "prague"), generator, impl,
                               window_ms)
        if self.spec.group_size < 2:
            raise ConfigError(f"prague: group_size must be >= 2, got {self.spec.group_size}")
        _no_more(opts, "prague", "group_size, generator, impl, window_ms")

    def check(self, world: int) -> None:
        if world < 2:
            raise ConfigError(f"prague needs >= 2 workers, got {world}")
        if self.spec.group_size > world:
            raise ConfigError(f"prague: group_size {self.spec.group_size} exceeds the "
                              f"{world} workers")

    def run(self, cfg: TrainConfig, env: WorkerEnv, learner: Learner,
            recorder: Recorder) -> int:
        from dlcomm.train.sync.run_prague import run_prague
        return run_prague(cfg, env, learner, recorder, self.spec)


@SYNCS.register("adpsgd", "AD-PSGD: asynchronous pairwise gossip, active/passive split")
class ADPSGD(Protocol):
    name = "adpsgd"

    def __init__(self, **options: str) -> None:
        opts = dict(options)
        self.graph = _GraphChoice.take(opts, "ring")
        _no_more(opts, "adpsgd", "graph, rows, edges")

    def check(self, world: int) -> None:
        split_roles(self.graph.build(world))

    def run(self, cfg: TrainConfig, env: WorkerEnv, learner: Learner,
            recorder: Recorder) -> int:
        from dlcomm.train.sync.run_adpsgd import run_adpsgd
        roles = split_roles(self.graph.build(env.world_size))
        recorder.start_together(learner)
        return run_adpsgd(cfg, env, learner, recorder, roles)


def parse_sync(text: str | Spec, world: int | None = None) -> Protocol:
    """The protocol named by ``text`` (not ``bsp``), checked for ``world`` workers if given."""
    spec = text if isinstance(text, Spec) else parse_spec(text)
    if spec.name == "bsp":
        raise ConfigError("bsp is the synchronous DDP loop, not a decentralized protocol")
    options = {k.replace("-", "_"): v for k, v in spec.options.items()}
    protocol = SYNCS.get(spec.name)(**options)
    if world is not None:
        protocol.check(world)
    return protocol
