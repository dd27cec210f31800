"""The cluster plan is pure data: check it without root."""

import pytest

from dlcomm.emulate.plan import (
    SWITCH_HOST,
    ClusterSpec,
    parse_topology,
    plan_cluster,
    setup_commands,
    tbf_burst_bytes,
    teardown_commands,
)
from dlcomm.errors import ConfigError


def tbf_rates(cmds):
    """(namespace, device) -> shaped rate, from the generated tc commands."""
    return {(c[2], c[6]): int(c[c.index("rate") + 1].removesuffix("bit"))
            for c in cmds if c[0] == "tc"}


def test_star_plan():
    plan = plan_cluster(ClusterSpec("t1", 3, 1e9))
    assert plan.hosts == ("dlcomm-t1-h0", "dlcomm-t1-h1", "dlcomm-t1-h2")
    assert plan.switches == ("dlcomm-t1-sw",) and plan.core == "dlcomm-t1-sw"
    assert plan.addresses == ("10.77.0.1", "10.77.0.2", "10.77.0.3")
    rates = tbf_rates(setup_commands(plan))
    # every link is shaped in both directions: host egress and switch-port egress
    assert rates == {("dlcomm-t1-h0", "eth0"): 10**9, ("dlcomm-t1-sw", "p0"): 10**9,
                     ("dlcomm-t1-h1", "eth0"): 10**9, ("dlcomm-t1-sw", "p1"): 10**9,
                     ("dlcomm-t1-h2", "eth0"): 10**9, ("dlcomm-t1-sw", "p2"): 10**9}
    cmds = setup_commands(plan)
    assert ["ip", "-n", "dlcomm-t1-sw", "addr", "add", f"{SWITCH_HOST}/16", "dev", "br0"] in cmds
    assert teardown_commands(plan.namespaces)[0] == ["ip", "netns", "delete", "dlcomm-t1-h0"]


def test_leafspine_plan_oversubscribed_uplinks():
    plan = plan_cluster(ClusterSpec("t2", 6, 1e9, "leafspine:2:3:1.5"))
    assert plan.core == "dlcomm-t2-spine"
    assert set(plan.switches) == {"dlcomm-t2-leaf0", "dlcomm-t2-leaf1", "dlcomm-t2-spine"}
    rates = tbf_rates(setup_commands(plan))
    assert rates[("dlcomm-t2-leaf1", "uplink")] == 2 * 10**9  # 3 hosts x 1 Gbit / 1.5
    assert rates[("dlcomm-t2-spine", "l1")] == 2 * 10**9
    assert rates[("dlcomm-t2-h4", "eth0")] == 10**9
    hosts_of_leaf1 = [l.a_ns for l in plan.links if l.b_ns == "dlcomm-t2-leaf1"]
    assert hosts_of_leaf1 == ["dlcomm-t2-h3", "dlcomm-t2-h4", "dlcomm-t2-h5"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(name="Bad-Name", hosts=2, rate_bps=1e9), "must be 1-12"),
    (dict(name="ok", hosts=0, rate_bps=1e9), "1..4000 hosts"),
    (dict(name="ok", hosts=2, rate_bps=10), "at least 100kbit"),
    (dict(name="ok", hosts=4, rate_bps=1e9, topology="leafspine:2:3:1"), "has 6 hosts"),
    (dict(name="ok", hosts=4, rate_bps=1e9, topology="leafspine:2:2:0.5"), "OVERSUB >= 1"),
    (dict(name="ok", hosts=4, rate_bps=1e9, topology="ring"), "unknown topology"),
])
def test_bad_specs(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ClusterSpec(**kwargs)


def test_parse_topology_and_burst():
    assert parse_topology("star", 5) == (1, 5, 1.0)
    assert parse_topology("leafspine:2:4:2", 8) == (2, 4, 2.0)
    assert tbf_burst_bytes(1e8) == 64 * 1024
    assert tbf_burst_bytes(10e9) == 5_000_000  # 4 ms at 10 Gbit/s
