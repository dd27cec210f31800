"""Chakra traces run in dlcomm's simulator: a trace-driven executor on the fluid network.

Steps:

1. Index every rank's nodes: unique ids, dependencies inside the rank, known types, the
   attributes each type needs (ASTRA-sim's rules, feeder_v3's lenient integer types);
   each collective's group from ``pg_name`` (a communicator group id; "" or "0": all
   ranks), of which the rank must be a member.
2. Flow phases of every communication on the planner topology, per group with the
   simulator's algorithms (:mod:`dlcomm.plan.simulate.chakra_network`): ALL_REDUCE by
   the trace's recorded algorithm or the fastest alone, ALL_GATHER / REDUCE_SCATTER as
   rings, ALL_TO_ALL pairwise, a send one flow; alpha + hops x hop latency per step.
3. Execution (feeder_v3's rules): a node is ready when its ``data_deps`` and
   ``ctrl_deps`` are done. One compute stream per rank: ready COMP nodes run one at a time
   for ``duration_micros``, lowest id first (ASTRA-sim's issue order). The k-th
   collectives that the members of a group issue meet: the collective starts when the
   last member issues it (type and size must agree) and ends for all at once. A send
   starts when issued (eager); its receive (matched on src, dst, tag, in order) ends once
   it is issued and the data has arrived. BROADCAST replays its duration (as ASTRA-sim);
   METADATA and INVALID nodes end at once.
4. Transfers share the network max-min fairly (``fluid.Sharing``) on the schedule's event
   engine; the iteration ends with the last node. The same trace with free communication
   gives ``compute_only_s``; ``exposed_comm_s`` is the difference.

Unlike ASTRA-sim, which runs one communication per rank at a time, a rank's
communications run concurrently as far as its dependencies allow (dlcomm's model: DDP
buckets under tensor-parallel all-reduces and pipeline transfers).
"""

from __future__ import annotations

import heapq
import json
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dlcomm.errors import ConfigError
from dlcomm.plan.commtime import place_ranks
from dlcomm.plan.simulate.chakra import COMM_TYPES, NODE_TYPES, TraceNode, TraceSet
from dlcomm.plan.simulate.chakra_network import GroupCalls
from dlcomm.plan.simulate.collective import Step
from dlcomm.plan.simulate.fluid import Sharing, SimNetwork
from dlcomm.plan.simulate.schedule import _Engine
from dlcomm.plan.topology import LinkParams, build_topology, sized_spec
from dlcomm.plan.traffic import Parallelism

__all__ = ["ExecConfig", "exec_config", "run_traces", "recorded_config"]

_NETWORK = ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL")


@dataclass(frozen=True)
class ExecConfig:
    topology: str                       # planner spec; sized to the ranks if it has no size
    accelerators: int = 0               # size the topology to about N (0: the ranks)
    link_rate_gbps: float = LinkParams().rate_gbps
    ports: int = LinkParams().ports
    radix: int = LinkParams().radix
    algorithm: str = "trace"            # all-reduce: trace | best | ring | tree | ... (step 2)
    alpha_us: float = 1.0
    hop_latency_us: float = 0.5
    placement: str = "linear"           # rank r on accelerator r, or a seeded permutation
    seed: int = 0


@dataclass(eq=False)
class _Op:
    rank: int
    node: TraceNode
    kind: str                           # comp | coll | send | recv | timer | none
    left: int = 0                       # dependencies not done yet
    children: list[_Op] = field(default_factory=list)
    steps: tuple[Step, ...] = ()
    group: str = ""                     # coll: communicator group id
    key: tuple[int, ...] = ()           # coll: (type, size); send/recv: (src, dst, tag)
    end: float | None = None


def _where(op: _Op) -> str:
    return f"rank {op.rank} node {op.node.id} ({op.node.name or f'type {op.node.type}'})"


def _int(op: _Op, name: str, default: int | None = None) -> int:
    value = op.node.attrs.get(name, default)
    if value is None:
        raise ConfigError(f"{_where(op)} needs attribute {name!r} with a value")
    if not isinstance(value, int):           # bool is an int: feeder_v3 converts it
        raise ConfigError(f"{_where(op)}: attribute {name!r} must be an integer, got "
                          f"{type(value).__name__}")
    return int(value)


def _index(traces: TraceSet, calls: GroupCalls) -> list[list[_Op]]:
    """Every rank's nodes as operations with their phases (step 1)."""
    n = len(traces.ranks)
    groups = {"0": list(range(n)), **traces.groups}
    out = []
    for rank, nodes in enumerate(traces.ranks):
        ops: dict[int, _Op] = {}
        for node in nodes:
            if node.id in ops:
                raise ConfigError(f"rank {rank}: node id {node.id} appears twice")
            ops[node.id] = op = _Op(rank, node, "none")
            _classify(op, groups, calls, n)
        for op in ops.values():
            for dep in set(op.node.data_deps) | set(op.node.ctrl_deps):
                if dep not in ops:
                    raise ConfigError(f"{_where(op)} depends on node {dep}, which rank "
                                      f"{rank}'s trace does not have")
                ops[dep].children.append(op)
                op.left += 1
        for op in ops.values():
            op.children.sort(key=lambda c: c.node.id)
        out.append(sorted(ops.values(), key=lambda o: o.node.id))
    return out


def _classify(op: _Op, groups: dict[str, list[int]], calls: GroupCalls, ranks: int) -> None:
    """Set what ``op`` does (step 1 and 2)."""
    node, kind = op.node, NODE_TYPES[op.node.type] if 0 <= op.node.type < 8 else None
    if kind in ("COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE") and \
            op.node.attrs.get("is_cpu_op"):
        raise ConfigError(f"{_where(op)}: a communication node cannot be a CPU op")
    if kind == "COMP_NODE":
        op.kind = "comp"
    elif kind in ("INVALID_NODE", "METADATA_NODE"):
        op.kind = "none"
    elif kind == "COMM_COLL_NODE":
        number = _int(op, "comm_type")
        comm = COMM_TYPES[number] if 0 <= number < len(COMM_TYPES) else str(number)
        size = _int(op, "comm_size")
        if comm == "BROADCAST":
            op.kind = "timer"
            return
        if comm not in _NETWORK:
            raise ConfigError(f"{_where(op)}: collective {comm} is not supported (ASTRA-sim "
                              f"and dlcomm run {', '.join(_NETWORK)}; BROADCAST by duration)")
        pg = node.attrs.get("pg_name", "")
        if not isinstance(pg, str):
            raise ConfigError(f"{_where(op)}: pg_name must be a string group id")
        op.group = pg or "0"
        if op.group not in groups:
            raise ConfigError(f"{_where(op)}: unknown communicator group {pg!r} (give the "
                              "comm group JSON with --comm-groups)")
        if op.rank not in groups[op.group]:
            raise ConfigError(f"{_where(op)}: rank {op.rank} is not in group {op.group}")
        hint = node.attrs.get("dlcomm_algorithm")
        op.kind, op.key = "coll", (number, size)
        op.steps = calls.collective(op.group, groups[op.group], comm, size,
                                    hint if isinstance(hint, str) else None)
    elif kind in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
        send = kind == "COMM_SEND_NODE"
        src = _int(op, "comm_src", None if not send else op.rank)
        dst = _int(op, "comm_dst", op.rank if not send else None)
        if (src if send else dst) != op.rank or not (0 <= src < ranks and 0 <= dst < ranks):
            raise ConfigError(f"{_where(op)}: {'comm_src' if send else 'comm_dst'} must be "
                              f"the rank itself, and both ends ranks of the set")
        op.kind, op.key = ("send" if send else "recv"), (src, dst, _int(op, "comm_tag"))
        if send:
            op.steps = calls.p2p(src, dst, _int(op, "comm_size"))
    else:
        raise ConfigError(f"{_where(op)}: node type {kind or node.type} is not supported "
                          "(COMP, COMM_COLL, COMM_SEND, COMM_RECV, METADATA, INVALID)")


class _Executor:
    """Step 3 on the engine; ``network=False``: every communication takes no time."""

    def __init__(self, ranks: list[list[_Op]], groups: dict[str, list[int]], sharing: Sharing,
                 network: bool = True) -> None:
        self.ranks, self.groups, self.network = ranks, groups, network
        self.eng = _Engine(sharing)
        self.stream: list[list[tuple[int, _Op]]] = [[] for _ in ranks]
        self.busy = [False] * len(ranks)
        self.issued: dict[str, dict[int, deque[_Op]]] = defaultdict(lambda: defaultdict(deque))
        self.arrived: Counter[tuple[int, ...]] = Counter()
        self.posted: dict[tuple[int, ...], deque[_Op]] = defaultdict(deque)
        self.compute_s = [0.0] * len(ranks)
        self.met: Counter[str] = Counter()

    def run(self) -> float:
        for ops in self.ranks:
            for op in ops:
                if not op.left:
                    self.ready(op)
        self.eng.run()
        self._check()
        return max((op.end or 0.0 for ops in self.ranks for op in ops), default=0.0)

    def ready(self, op: _Op) -> None:
        eng = self.eng
        if op.kind == "comp":
            heapq.heappush(self.stream[op.rank], (op.node.id, op))
            self._compute(op.rank)
        elif op.kind == "coll":
            self._issue(op)
        elif op.kind == "send":
            def sent() -> None:
                self._arrive(op.key)
                self.done(op)
            self._transfer(op.steps, sent)
        elif op.kind == "recv":
            self.posted[op.key].append(op)
            self._match(op.key)
        else:
            duration = op.node.duration_micros * 1e-6 if op.kind == "timer" else 0.0
            eng.at(eng.now + duration, lambda: self.done(op))

    def done(self, op: _Op) -> None:
        op.end = self.eng.now
        for child in op.children:
            child.left -= 1
            if not child.left:
                self.ready(child)

    def _compute(self, rank: int) -> None:
        if self.busy[rank] or not self.stream[rank]:
            return
        _, op = heapq.heappop(self.stream[rank])
        self.busy[rank] = True
        duration = op.node.duration_micros * 1e-6
        self.compute_s[rank] += duration

        def finish() -> None:
            self.busy[rank] = False
            self.done(op)
            self._compute(rank)
        self.eng.at(self.eng.now + duration, finish)

    def _issue(self, op: _Op) -> None:
        queues, members = self.issued[op.group], self.groups[op.group]
        queues[op.rank].append(op)
        if not all(queues[m] for m in members):
            return
        heads = [queues[m].popleft() for m in members]
        odd = next((h for h in heads if h.key != op.key), None)
        if odd is not None:
            raise ConfigError(f"collectives of group {op.group} disagree: {_where(op)} is "
                              f"{_describe(op)}, {_where(odd)} {_describe(odd)}")
        self.met[COMM_TYPES[op.key[0]]] += 1

        def finished() -> None:
            for h in heads:
                self.done(h)
        self._transfer(op.steps, finished)

    def _arrive(self, key: tuple[int, ...]) -> None:
        self.arrived[key] += 1
        self._match(key)

    def _match(self, key: tuple[int, ...]) -> None:
        while self.arrived[key] and self.posted[key]:
            self.arrived[key] -= 1
            op = self.posted[key].popleft()
            self.eng.at(self.eng.now, partial(self.done, op))

    def _transfer(self, steps: tuple[Step, ...], done: Callable[[], Any]) -> None:
        """The steps one after another: latency, then the fluid transfer."""
        eng = self.eng

        def step(i: int) -> None:
            if i == len(steps) or not self.network:
                done()
                return
            st = steps[i]

            def send() -> None:
                if st.nbytes > 0:
                    eng.transfer(st.pattern, st.nbytes, lambda: step(i + 1))
                else:
                    step(i + 1)
            eng.at(eng.now + st.latency_s, send)
        eng.at(eng.now, lambda: step(0))

    def _check(self) -> None:
        """Every node ran; else say which collective, receive or dependency stopped it."""
        for gid, queues in self.issued.items():
            for queue in queues.values():
                if queue:
                    missing = [m for m in self.groups[gid] if not queues[m]]
                    raise ConfigError(f"{_where(queue[0])}: {_describe(queue[0])} on group "
                                      f"{gid} never met: rank(s) {missing[:8]} did not issue it")
        for key, queue in self.posted.items():
            if queue:
                raise ConfigError(f"{_where(queue[0])}: receive from rank {key[0]} (tag "
                                  f"{key[2]}) never matched a send")
        stuck = [op for ops in self.ranks for op in ops if op.end is None]
        if stuck:
            raise ConfigError(f"{_where(stuck[0])} and {len(stuck) - 1} more never became "
                              "ready (a dependency cycle?)")


def _describe(op: _Op) -> str:
    return f"{COMM_TYPES[op.key[0]]} of {op.key[1]} B"


def recorded_config(traces: TraceSet) -> dict[str, Any]:
    """What dlcomm's exporter recorded in the metadata (``dlcomm``: config, topology, link,
    parallelism, simulated iteration_s), or {} for other traces."""
    try:
        about = json.loads(traces.metadata.get("dlcomm") or "{}")
    except (TypeError, ValueError):
        return {}
    return about if isinstance(about, dict) else {}


def exec_config(traces: TraceSet, **given: Any) -> ExecConfig:
    """The executor's options: those ``given`` (None: not given), else what dlcomm's
    exporter recorded (the simulation's topology, links, latencies, placement), else the
    defaults."""
    about = recorded_config(traces)
    config = about.get("config", {}) if isinstance(about.get("config"), dict) else {}
    recorded = {"topology": about.get("topology"), **{k: config.get(k) for k in (
        "link_rate_gbps", "ports", "radix", "alpha_us", "hop_latency_us",
        "placement", "seed")}}
    values = {k: v for k, v in recorded.items() if v is not None}
    values.update({k: v for k, v in given.items() if v is not None})
    if not values.get("topology"):
        raise ConfigError("--topology is required: these traces do not record the topology "
                          "they were simulated on")
    try:
        return ExecConfig(**values)
    except TypeError as exc:
        raise ConfigError(f"bad executor option ({exc})") from None


def run_traces(traces: TraceSet, cfg: ExecConfig) -> dict[str, Any]:
    """Run ``traces`` on ``cfg``'s topology (module docstring): ``summary``, ``ranks``."""
    t0 = time.perf_counter()
    n = len(traces.ranks)
    link = LinkParams(cfg.link_rate_gbps, cfg.ports, cfg.radix)
    topo = build_topology(sized_spec(cfg.topology, max(cfg.accelerators or n, 2), link), link)
    where = place_ranks(Parallelism(dp=n), topo.accelerators, cfg.placement, cfg.seed)
    net = SimNetwork(topo, where)
    calls = GroupCalls(net, cfg.algorithm, cfg.alpha_us * 1e-6, cfg.hop_latency_us * 1e-6)
    ranks = _index(traces, calls)
    sharing = net.sharing(st.pattern for ops in ranks for op in ops for st in op.steps)
    groups = {"0": list(range(n)), **traces.groups}
    run = _Executor(ranks, groups, sharing)
    iteration = run.run()
    ends = [max((op.end or 0.0 for op in ops), default=0.0) for ops in ranks]
    for ops in ranks:
        for op in ops:
            op.left, op.end = len({*op.node.data_deps, *op.node.ctrl_deps}), None
    compute_only = _Executor(ranks, groups, sharing, network=False).run()
    types = Counter(NODE_TYPES[op.node.type] for ops in ranks for op in ops)
    summary = {"iteration_s": iteration, "compute_only_s": compute_only,
               "exposed_comm_s": max(iteration - compute_only, 0.0),
               "compute_s": max(run.compute_s), "ranks": n,
               "nodes": sum(types.values()), "node_types": dict(types),
               "collectives": dict(run.met), "topology": topo.spec,
               "topology_name": topo.name, "topology_accelerators": topo.accelerators,
               "events": run.eng.events, "rate_solves": sharing.solves,
               "patterns": len(sharing.keys), "simulate_s": time.perf_counter() - t0}
    recorded = recorded_config(traces).get("iteration_s")
    if isinstance(recorded, (int, float)) and recorded > 0:
        summary["recorded_iteration_s"] = recorded
        summary["recorded_error"] = iteration / recorded - 1
    return {"summary": summary, "ranks": [{"rank": r, "end_s": ends[r],
                                           "compute_s": run.compute_s[r],
                                           "nodes": len(ranks[r])} for r in range(n)]}
