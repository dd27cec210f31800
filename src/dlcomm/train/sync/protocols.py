"""The ``--sync`` specs of the decentralized protocols, parsed and checked before any
training starts (each registered in :data:`~.base.SYNCS`; ``bsp`` is in :mod:`.bsp`).

    hop:graph=ring|torus|exp|complete|bipartite|edges,rows=R,edges=0-1+1-2,
        max_gap=4,backup=0,staleness=3,skip=1,reuse=0   (the defaults)
    prague:group_size=4,generator=buffer|random|static,impl=dist|switch,window_ms=auto
    adpsgd:graph=ring|bipartite|torus|edges,...

Keys may be written with dashes (``max-gap``); unknown keys are errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlcomm.errors import ConfigError
from dlcomm.registry import reject_unknown, take_option
from dlcomm.runtime.env import WorkerEnv
from dlcomm.train.common import Learner
from dlcomm.train.config import TrainConfig
from dlcomm.train.sync.adpsgd import split_roles
from dlcomm.train.sync.base import SYNCS, Decentralized
from dlcomm.train.sync.graphs import GRAPHS, Graph, make_graph
from dlcomm.train.sync.hop import HopOptions
from dlcomm.train.sync.prague import GENERATORS, PragueSpec
from dlcomm.train.sync.recorder import Recorder

__all__ = ["Hop", "Prague", "ADPSGD"]


@dataclass(frozen=True)
class _GraphChoice:
    name: str = "ring"
    options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def take(cls, options: dict[str, str], default: str) -> _GraphChoice:
        name = options.pop("graph", default)
        extra = {k: options.pop(k) for k in ("rows", "edges") if k in options}
        GRAPHS.get(name)
        return cls(name, extra)

    def build(self, world: int) -> Graph:
        return make_graph(self.name, world, **self.options)


@SYNCS.register("hop", "Hop: queues and tokens bound the iteration gap; backup, staleness, skip")
class Hop(Decentralized):
    name = "hop"

    def __init__(self, **options: str) -> None:
        opts = dict(options)
        self.graph = _GraphChoice.take(opts, "ring")
        d = HopOptions()  # the defaults tolerate a straggler (hop.py, "Defaults")
        self.options = HopOptions(max_gap=take_option(opts, "max_gap", int, d.max_gap, "hop"),
                                  backup=take_option(opts, "backup", int, d.backup, "hop"),
                                  staleness=take_option(opts, "staleness", int, d.staleness,
                                                        "hop"),
                                  skip=take_option(opts, "skip", int, d.skip, "hop"),
                                  reuse=take_option(opts, "reuse", int, d.reuse, "hop"))
        reject_unknown(opts, "hop", ("graph", "rows", "edges", "max_gap", "backup", "staleness",
                                     "skip", "reuse"))

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
class Prague(Decentralized):
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
            raise ConfigError(f"prague: window_ms must be a number or auto, got {window!r}"
                              ) from None
        if window_ms is not None and window_ms < 0:
            raise ConfigError(f"prague: window_ms must be >= 0, got {window_ms:g}")
        self.spec = PragueSpec(take_option(opts, "group_size", int, 4, "prague"), generator, impl,
                               window_ms)
        if self.spec.group_size < 2:
            raise ConfigError(f"prague: group_size must be >= 2, got {self.spec.group_size}")
        reject_unknown(opts, "prague", ("group_size", "generator", "impl", "window_ms"))

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
class ADPSGD(Decentralized):
    name = "adpsgd"

    def __init__(self, **options: str) -> None:
        opts = dict(options)
        self.graph = _GraphChoice.take(opts, "ring")
        reject_unknown(opts, "adpsgd", ("graph", "rows", "edges"))

    def check(self, world: int) -> None:
        split_roles(self.graph.build(world))

    def run(self, cfg: TrainConfig, env: WorkerEnv, learner: Learner,
            recorder: Recorder) -> int:
        from dlcomm.train.sync.run_adpsgd import run_adpsgd
        roles = split_roles(self.graph.build(env.world_size))
        recorder.start_together(learner)
        return run_adpsgd(cfg, env, learner, recorder, roles)
