"""Exact counts of every topology on small sizes, checked by hand and against the graphs."""

from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.errors import ConfigError, RegistryError
from dlcomm.plan.topology import COMPARE_SET, TOPOLOGIES, LinkParams, build_topology, sized_spec
from dlcomm.plan.topology.clos import Clos


def groups(topo):
    return {(g.role, g.level): (g.count, g.ports_used) for g in topo.counts().switches}


def test_two_level_fat_tree_by_hand():
    # radix 8, 1 port per accelerator, 16 accelerators: 4 leaves (4 down, 4 up),
    # 2 spines with 2 links to every leaf; 16 DAC, 16 AOC, 16 + 2*16 switch ports
    t = build_topology("fattree:n=16,ports=1,radix=8")
    assert groups(t) == {("leaf", 1): (4, 32), ("spine", 2): (2, 16)}
    c = t.counts()
    assert c.cables == {"dac": 16, "aoc": 16} and c.switch_ports_used == 48
    assert c.nic_ports == c.switched_ports == 16 and c.long_cable_ports == 0


def test_three_level_fat_tree_is_the_k_ary_fat_tree():
    # k = 4: k^3/4 = 16 hosts, k^2/2 = 8 edge and 8 aggregation, (k/2)^2 = 4 core switches
    t = build_topology("fattree:n=16,ports=1,radix=4")
    assert groups(t) == {("leaf", 1): (8, 32), ("aggregation", 2): (8, 32), ("core", 3): (4, 16)}
    assert t.counts().switch_ports_used == 5 * 16
    assert t.counts().cables == {"dac": 16, "aoc": 32}


def test_tapered_fat_tree_by_hand():
    # radix 8, taper 0.5: leaves of 5 down + 3 up (3/5 >= 1/2), 20 hosts -> 4 leaves,
    # 12 up links on 3 spines
    t = build_topology("fattree:n=20,taper=0.5,ports=1,radix=8")
    assert groups(t) == {("leaf", 1): (4, 32), ("spine", 2): (3, 12)}
    assert t.bisection_gbps() == 2 * 3 * 400


def test_fat_tree_rounds_to_whole_leaves_with_ports_together():
    # 4 ports per accelerator, radix 16: 8 down ports = 2 accelerators per leaf
    t = build_topology("fattree:n=9,radix=16")
    assert t.accelerators == 10 and t.clos.leaves == 5
    assert groups(t)[("spine", 2)] == (4, 40)       # 5 leaves x 8 up over 4 spines
    assert build_topology("fattree:n=8,radix=64").clos.levels == 1     # 32 ports: 1 switch


def test_fat_tree_limits():
    with pytest.raises(ConfigError, match="more than 3 levels"):
        build_topology("fattree:n=20000,radix=64")
    assert Clos(65536, 64).levels == 3
    with pytest.raises(ConfigError, match="taper"):
        build_topology("fattree:n=64,taper=1")


def test_torus_counts_by_hand():
    t = build_topology("torus2d:x=8,y=8")
    c = t.counts()
    # 2 links per accelerator; each ring of 8 leaves its two 4-wide racks twice
    assert c.cables == {"dac": 96, "aoc": 32} and c.switches == ()
    assert c.nic_ports == 256 and c.long_cable_ports == 64
    assert build_topology("torus2d:x=4,y=4").counts().cables == {"dac": 32, "aoc": 0}
    t3 = build_topology("torus3d:x=4,y=4,z=4,ports=6")
    assert t3.counts().cables == {"dac": 192, "aoc": 0}
    with pytest.raises(ConfigError, match="multiples of 6"):
        build_topology("torus3d:x=4,y=4,z=4")


def test_hxmesh_counts_by_hand():
    # 4 x 4 grid of 2 x 2 boards: each board 8 edge ports, 4 trace links; 8 row and
    # 8 column networks of 8 endpoints, one switch each
    t = build_topology("hxmesh:a=2,b=2,x=4,y=4")
    c = t.counts()
    assert c.accelerators == 64 and c.switched_ports == c.long_cable_ports == 128
    assert c.trace_links == 64 and c.cables == {"dac": 0, "aoc": 128}
    assert groups(t) == {("row leaf", 1): (8, 64), ("column leaf", 1): (8, 64)}


def test_hxmesh_with_two_level_rows():
    # rows of 16 boards: 32 endpoints on radix 8: 8 leaves (4+4) and 4 spines
    t = build_topology("hxmesh:a=2,b=2,x=16,y=2,radix=8")
    g = groups(t)
    assert g[("row leaf", 1)] == (4 * 8, 4 * 64) and g[("row spine", 2)] == (4 * 4, 4 * 32)
    assert g[("column leaf", 1)] == (32, 32 * 4)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(2, 5), st.integers(2, 5))
def test_hxmesh_switched_fraction_is_exact(a, b, x, y):
    c = build_topology(f"hxmesh:a={a},b={b},x={x},y={y}").counts()
    expected = Fraction(a + b, 2 * a * b)
    assert Fraction(c.switched_ports, c.accelerator_ports) == expected
    assert Fraction(c.long_cable_ports, c.accelerator_ports) == expected
    # ports not on switches are wired pairwise in board traces
    assert c.accelerator_ports - c.switched_ports == 2 * c.trace_links


def test_hyperx_is_hx1mesh():
    t = build_topology("hyperx2d:x=4,y=3")
    assert t.name == "2D HyperX 4x3" and t.spec == "hyperx2d:x=4,y=3"
    c = t.counts()
    assert c.switched_ports == c.accelerator_ports == 48 and c.trace_links == 0


def test_dragonfly_counts_by_hand():
    # radix 8 -> p = h = 2, a = 4; one port per accelerator -> 2 per router; g = 3:
    # 24 accelerators, 4 global links per group pair, 18 local links
    t = build_topology("dragonfly:g=3,radix=8,ports=1")
    c = t.counts()
    assert (t.accelerators, t.links_per_pair) == (24, 4)
    assert c.cables == {"dac": 24 + 18, "aoc": 12}
    assert groups(t) == {("router", 1): (12, 24 + 2 * 30)}
    with pytest.raises(ConfigError, match="at most 9 groups"):
        build_topology("dragonfly:g=10,radix=8,ports=1")


SPECS = ["fattree:n=16,ports=1,radix=4", "fattree:n=20,taper=0.5,ports=1,radix=8",
         "fattree:n=128,radix=16", "torus2d:x=8,y=4", "torus3d:x=4,y=2,z=4,ports=6",
         "hxmesh:a=2,b=2,x=16,y=2,radix=8", "hxmesh:a=3,b=1,x=3,y=2", "hyperx2d:x=4,y=3",
         "dragonfly:g=3,radix=8,ports=1", "dragonfly:g=6,radix=16"]


@pytest.mark.parametrize("spec", SPECS)
def test_graph_matches_counts(spec):
    t = build_topology(spec)
    c = t.counts()
    g = t.graph("switches")
    cables = Counter()
    for _, _, data in g.edges(data=True):
        cables[data["cable"]] += data["links"]
    assert cables["trace"] == c.trace_links
    assert cables["dac"] == c.cables["dac"] and cables["aoc"] == c.cables["aoc"]
    switches = [n for n, k in g.nodes(data="kind") if k == "switch"]
    assert len(switches) == c.switch_count
    ports = {n: sum(d["links"] for *_, d in g.edges(n, data=True)) for n in switches}
    assert sum(ports.values()) == c.switch_ports_used
    assert max(ports.values(), default=0) <= t.params.radix
    accs = [n for n, k in g.nodes(data="kind") if k == "acc"]
    assert sorted(accs) == list(range(c.accelerators))
    assert all(sum(d["links"] for *_, d in g.edges(n, data=True)) == t.params.ports
               for n in accs)
    assert build_topology(t.spec).counts() == c          # the spec rebuilds it


def test_registry_and_specs():
    assert set(TOPOLOGIES) == {"fattree", "torus2d", "torus3d", "dragonfly", "hyperx2d",
                               "hxmesh", "nodes"}
    with pytest.raises(RegistryError):
        build_topology("butterfly:n=4")
    with pytest.raises(ConfigError, match="no option"):
        build_topology("torus2d:x=4,y=4,q=1")
    with pytest.raises(ConfigError, match="bad value"):
        build_topology("torus2d:x=4,y=four")
    t = build_topology("torus2d:x=4,y=4,rate=200gbit", LinkParams(ports=8))
    assert t.params == LinkParams(200.0, 8, 64) and t.lanes == 2
    assert t.spec == "torus2d:x=4,y=4,rate=200,ports=8"


@pytest.mark.parametrize("n", [1024, 16384])
def test_sized_specs_match_the_papers_configurations(n):
    specs = {s.split(":")[0] + s.split(":")[1].split(",")[0] if ":" in s else s:
             sized_spec(s, n) for s in COMPARE_SET}
    sizes = {spec: build_topology(spec).accelerators for spec in specs.values()}
    assert all(abs(v - n) / n < 0.01 for v in sizes.values())
    if n == 1024:
        assert sized_spec("hxmesh:a=4", n) == "hxmesh:a=4,b=4,x=8,y=8"
        assert sized_spec("hxmesh:a=2", n) == "hxmesh:a=2,b=2,x=16,y=16"
        assert sized_spec("torus2d", n) == "torus2d:x=32,y=32"
        assert sized_spec("dragonfly", n) == "dragonfly:g=8"
    t3 = build_topology(sized_spec("torus3d", n))
    assert t3.injection_gbps == pytest.approx(1600, rel=1e-5)
