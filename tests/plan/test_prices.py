"""Prices: documented defaults, file overrides, bad files, and the cost of a network."""

import json

import pytest

from dlcomm.errors import ConfigError
from dlcomm.plan.prices import SOURCES, Prices, load_prices, network_cost
from dlcomm.plan.topology import build_topology


def test_every_price_has_a_source():
    assert set(SOURCES) == set(Prices().__dict__)
    assert all(text for text in SOURCES.values())


def test_overrides_from_json_and_toml(tmp_path):
    j = tmp_path / "p.json"
    j.write_text(json.dumps({"aoc": 1000, "dac": 150.5}))
    assert load_prices(j) == Prices(aoc=1000.0, dac=150.5)
    t = tmp_path / "p.toml"
    t.write_text("[prices]\nswitch_port = 500\n")
    assert load_prices(t) == Prices(switch_port=500.0)
    assert load_prices(None) == Prices()


@pytest.mark.parametrize("content,match", [
    ('{"laser": 3}', "unknown price 'laser'"), ('{"aoc": -1}', ">= 0"),
    ('{"aoc": "cheap"}', ">= 0"), ("{not json", "corrupt"), ("[1, 2]", "object")])
def test_bad_price_files(tmp_path, content, match):
    f = tmp_path / "p.json"
    f.write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_prices(f)
    with pytest.raises(ConfigError, match="No such file"):
        load_prices(tmp_path / "missing.json")


def test_cost_by_hand():
    # Hx2Mesh 4x4: 128 switch ports, 128 AOCs, 128 cabled NIC ports, 64 traces
    prices = Prices(switch_port=1, dac=10, aoc=100, nic_port=1000, board_trace=10000)
    cost = network_cost(build_topology("hxmesh:a=2,b=2,x=4,y=4").counts(), prices)
    assert cost.total == 128 * 1 + 128 * 100 + 128 * 1000 + 64 * 10000
    assert cost.per_accelerator == cost.total / 64
    # fat tree of 16 on radix 8 (2 levels): 48 ports, 16 DAC, 16 AOC, 16 NIC ports
    cost = network_cost(build_topology("fattree:n=16,ports=1,radix=8").counts(), prices)
    assert cost.total == 48 + 16 * 10 + 16 * 100 + 16 * 1000
    assert cost.to_dict()["items"]["dac"] == {"count": 16, "unit_usd": 10.0, "usd": 160.0}
