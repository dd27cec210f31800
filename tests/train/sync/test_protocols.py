"""``--sync`` specs: parsing, defaults, one-line errors, checks against the world size."""

from __future__ import annotations

import pytest

from dlcomm.errors import ConfigError
from dlcomm.train.sync import check_sync, parse_sync
from dlcomm.train.sync.hop import HopOptions


def test_hop_spec_with_dashes_and_defaults():
    hop = parse_sync("hop:graph=exp,max-gap=3,backup=1,staleness=1,skip=2", 8)
    assert hop.options == HopOptions(max_gap=3, backup=1, staleness=1, skip=2)
    assert hop.graph.name == "exp"
    assert parse_sync("hop").options == HopOptions()
    assert parse_sync("hop:graph=torus,rows=2", 8).graph.build(8).name == "torus2x4"


def test_prague_and_adpsgd_specs():
    p = parse_sync("prague:group_size=3,generator=static,impl=switch", 8)
    assert (p.spec.group_size, p.spec.generator, p.spec.impl) == (3, "static", "switch")
    assert parse_sync("prague").spec.generator == "buffer"
    assert parse_sync("prague:window_ms=4").spec.window_ms == 4.0
    assert parse_sync("adpsgd:graph=bipartite", 5).graph.name == "bipartite"
    check_sync("bsp")


@pytest.mark.parametrize("spec,world,message", [
    ("gossip", 4, "unknown sync protocol 'gossip'"),
    ("bsp:x=1", 4, r"sync 'bsp' has no option\(s\) \['x'\]"),
    ("hop:max_gap=two", 4, "hop: bad value max_gap='two' \\(an integer\\)"),
    ("hop:max_gap=0", 4, "max_gap must be >= 1"),
    ("hop:backup=2", 8, "backup=2 must be below the in-degree"),
    ("hop:graph=star", 4, "unknown graph 'star'"),
    ("hop:colour=red", 4, r"hop has no option\(s\) \['colour'\]"),
    ("prague:generator=smart", 4, "unknown prague generator"),
    ("prague:group_size=5", 4, "group_size 5 exceeds the 4 workers"),
    ("prague:group_size=1", 4, "group_size must be >= 2"),
    ("prague:impl=switch", 4, "needs generator=static"),
    ("prague:impl=tcp", 4, "impl must be dist or switch"),
    ("prague:window_ms=-1", 4, "window_ms must be >= 0"),
    ("adpsgd", 5, "needs a bipartite graph"),
    ("adpsgd:graph=exp", 8, "needs a bipartite graph"),
])
def test_bad_specs_are_one_line_config_errors(spec, world, message):
    with pytest.raises(ConfigError, match=message) as info:
        check_sync(spec, world)
    assert "\n" not in str(info.value)
