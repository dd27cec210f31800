"""Network topologies for deep learning, by name: ``TOPOLOGIES`` and the spec syntax.

    from dlcomm.plan.topology import build_topology, sized_spec
    topo = build_topology("hxmesh:a=2,b=2,x=16,y=16")      # 1024 accelerators
    topo.counts(), topo.graph(), topo.bisection_gbps()
    build_topology(sized_spec("torus2d", 1024))             # torus2d:x=32,y=32

Specs: ``fattree:n=1024,taper=0.5[,ina=1]``, ``torus2d:x=32,y=32``,
``torus3d:x=8,y=8,z=16``, ``dragonfly:g=8[,a=32,p=16,h=16]``, ``hyperx2d:x=32,y=32``,
``hxmesh:a=2,b=2,x=16,y=16``, ``nodes:n=1024,node=dgx-a100`` (servers). Every spec
also takes ``rate`` (Gb/s, or e.g. 400gbit),
``ports`` (per accelerator) and ``radix`` (switch ports), overriding the defaults.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dlcomm.errors import ConfigError
from dlcomm.plan.topology.base import AllreduceChoice, Counts, LinkParams, SwitchGroup, Topology
from dlcomm.plan.topology.dragonfly import Dragonfly, make_dragonfly
from dlcomm.plan.topology.fattree import FatTree, make_fattree
from dlcomm.plan.topology.hxmesh import HxMesh, make_hxmesh, make_hyperx
from dlcomm.plan.topology.nodes import Nodes, make_nodes
from dlcomm.plan.topology.torus import Torus, make_torus, near_cube
from dlcomm.registry import Registry, Spec

__all__ = ["TOPOLOGIES", "build_topology", "sized_spec", "COMPARE_SET", "Topology",
           "LinkParams", "Counts", "SwitchGroup", "AllreduceChoice", "FatTree", "Torus",
           "HxMesh", "Dragonfly", "Nodes"]

Factory = Callable[[dict, LinkParams], Topology]
TOPOLOGIES: Registry[Topology] = Registry("topology")
TOPOLOGIES.register("fattree", "fat tree: n accelerators, taper (0 = non-blocking), "
                               "ina=1 for aggregating switches")(make_fattree)
TOPOLOGIES.register("torus2d", "2D torus of x*y accelerators")(make_torus(2))
TOPOLOGIES.register("torus3d", "3D torus of x*y*z accelerators (6 ports each)")(make_torus(3))
TOPOLOGIES.register("dragonfly")(make_dragonfly)
TOPOLOGIES.register("hyperx2d")(make_hyperx)
TOPOLOGIES.register("hxmesh")(make_hxmesh)
TOPOLOGIES.register("nodes", "servers (node=dgx-a100|dgx-h100): NVSwitch inside, a non-blocking "
                             "fat tree between")(make_nodes)

# The HammingMesh paper's comparison (docs/references.md), sized by ``sized_spec``.
COMPARE_SET = ("fattree", "fattree:taper=0.5", "fattree:taper=0.75", "dragonfly",
               "torus2d", "torus3d", "hyperx2d", "hxmesh:a=2", "hxmesh:a=4")

_SIZE_KEYS = {"fattree": ("n",), "torus2d": ("x", "y"), "torus3d": ("x", "y", "z"),
              "dragonfly": ("g",), "hyperx2d": ("x", "y"), "hxmesh": ("x", "y"),
              "nodes": ("n",)}


def build_topology(spec: str | Spec, params: LinkParams | None = None) -> Topology:
    """Build a topology from its spec; ``params`` are the defaults the spec can override."""
    parsed = TOPOLOGIES.check(spec)
    factory: Factory = TOPOLOGIES.get(parsed.name)
    return factory(dict(parsed.options), params or LinkParams())


def sized_spec(spec: str, n: int, params: LinkParams | None = None) -> str:
    """Complete ``spec`` with the size options that give about ``n`` accelerators.

    Tori and grids take the factorization closest to a square (cube); HammingMesh sizes
    its board grid (a x b boards, default 2 x 2); a dragonfly takes whole groups; a 3D
    torus gets 6 ports per accelerator at a rate that keeps the injection bandwidth of the
    others (ports x rate). Options the spec already has are kept.
    """
    if n < 2:
        raise ConfigError(f"--accelerators must be >= 2, got {n}")
    params = params or LinkParams()
    parsed = TOPOLOGIES.check(spec)
    opts = dict(parsed.options)
    kind = parsed.name
    if all(k in opts for k in _SIZE_KEYS[kind]):
        return str(parsed)
    if kind in ("fattree", "nodes"):
        opts["n"] = str(n)
    elif kind in ("torus2d", "hyperx2d"):
        opts.update(zip("xy", map(str, near_cube(n, 2))))
    elif kind == "torus3d":
        opts.update(zip("xyz", map(str, near_cube(n, 3))))
        ports = int(opts.get("ports", params.ports))
        if ports % 6:
            rate = float(opts.get("rate", params.rate_gbps))
            opts["rate"] = f"{rate * ports / 6:.6g}"
            opts["ports"] = "6"
    elif kind == "hxmesh":
        a = int(opts.setdefault("a", "2"))
        b = int(opts.setdefault("b", str(a)))
        opts.update(zip("xy", map(str, near_cube(max(4, round(n / (a * b))), 2))))
    elif kind == "dragonfly":
        radix = int(opts.get("radix", params.radix))
        ports = int(opts.get("ports", params.ports))
        p = int(opts.get("p", radix // 4))
        a = int(opts.get("a", 2 * (radix // 4)))
        per_group = a * max(1, p // ports)
        opts["g"] = str(max(1, math.ceil(n / per_group)))
    return str(Spec(kind, opts))
