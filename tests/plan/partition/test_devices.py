"""Device groups, cluster files, and the throughput and links of each side of a split."""

from __future__ import annotations

import json

import pytest

from dlcomm.errors import ConfigError, RegistryError
from dlcomm.plan.partition.devices import make_cluster, parse_devices


def test_groups_from_a_spec():
    groups = parse_devices("tpu-v2:64, tpu-v3:64")
    assert [(g.accelerator.name, g.count) for g in groups] == [("tpu-v2", 64), ("tpu-v3", 64)]
    assert parse_devices("v100")[0].count == 1


def test_sides_of_the_first_split_are_the_groups():
    c = make_cluster("tpu-v2:64,tpu-v3:64")
    assert c.size == 128 and c.spec() == "tpu-v2:64,tpu-v3:64"
    sides = c.sides([(0, 64), (64, 128)])
    assert sides.flops.tolist() == [64 * 45e12 * 0.4, 64 * 123e12 * 0.4]
    # across groups each side keeps its own scale-up link (TPU ICI), per device
    assert sides.bandwidth.tolist() == [64 * 496e9 / 8, 64 * 656e9 / 8]
    assert sides.memory.tolist() == [16 * 2**30, 32 * 2**30]
    assert c.describe(0, 128) == "tpu-v2 x64+tpu-v3 x64"
    assert c.signature(0, 32) == c.signature(32, 64) != c.signature(64, 96)


def test_link_between_groups_and_efficiency():
    c = make_cluster("tpu-v2:2,tpu-v3:2", between_gbps=100, efficiency=0.5)
    across = c.sides([(0, 2), (2, 4)])
    assert across.bandwidth.tolist() == [2 * 100e9 / 8] * 2
    inside = c.sides([(0, 1), (1, 2)])
    assert inside.bandwidth.tolist() == [496e9 / 8] * 2     # scale-up inside a group
    assert across.flops[0] == 2 * 45e12 * 0.5


def test_cluster_file_with_a_user_device(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('devices = "npu:2,a100:2"\nbetween_gbps = 50\n'
                 "[accelerators.npu]\npeak_flops = 2e14\nmemory_gb = 48\n"
                 "scaleup_gbps = 800\n")
    c = make_cluster(cluster_file=str(f))
    assert c.spec() == "npu:2,a100:2" and c.between_gbps == 50
    assert c.accelerator(0).peak_flops == 2e14
    # the command line wins over the file
    assert make_cluster("a100:4", str(f)).spec() == "a100:4"
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"devices": [{"device": "v100", "count": 2}]}))
    assert make_cluster(cluster_file=str(j)).spec() == "v100:2"


@pytest.mark.parametrize(("spec", "error", "match"), [
    ("tpu-v9:4", RegistryError, "unknown accelerator 'tpu-v9'"),
    ("tpu-v2:x", ConfigError, "bad device count"),
    ("tpu-v2:0", ConfigError, ">= 1"),
    ("", ConfigError, "no devices"),
])
def test_bad_specs(spec, error, match):
    with pytest.raises(error, match=match):
        parse_devices(spec)


def test_bad_files_and_options(tmp_path):
    with pytest.raises(ConfigError, match="no devices"):
        make_cluster()
    with pytest.raises(ConfigError, match="cluster file .*missing.toml"):
        make_cluster(cluster_file=str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("devices = [")
    with pytest.raises(ConfigError, match="corrupt"):
        make_cluster(cluster_file=str(bad))
    typo = tmp_path / "typo.toml"
    typo.write_text('device = "a100:2"\n')
    with pytest.raises(ConfigError, match="unknown keys"):
        make_cluster(cluster_file=str(typo))
    with pytest.raises(ConfigError, match="between_gbps"):
        make_cluster("a100:2", between_gbps=0)
    with pytest.raises(ConfigError, match="efficiency"):
        make_cluster("a100:2", efficiency=1.5)
