import json

import pytest

from dlcomm.errors import ConfigError
from dlcomm.train.config import TrainConfig, load_config_file, parse_fault


def test_cli_overrides_file_overrides_defaults():
    cfg = TrainConfig.from_sources({"workers": 2, "lr": 1, "exchange": "ring"},
                                   {"workers": 3, "epochs": None})
    assert (cfg.workers, cfg.lr, cfg.epochs, cfg.workload) == (3, 1.0, None, "digits-cnn")


@pytest.mark.parametrize("values,message", [
    ({"workers": 0}, "--workers must be >= 1"),
    ({"workers": True}, "must be int"),
    ({"workers": "2"}, "must be int"),
    ({"lr": -1.0}, "--lr must be > 0"),
    ({"master_port": 70000}, "0..65535"),
    ({"fault": "1:x:kill"}, "bad --fault"),
    ({"wrkers": 2}, "unknown option 'wrkers'"),
])
def test_bad_values(values, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_sources(values)


def test_config_files(tmp_path):
    good = tmp_path / "c.toml"
    good.write_text('workers = 2\nworkload = "synthetic:numel=10"\n')
    assert load_config_file(good) == {"workers": 2, "workload": "synthetic:numel=10"}
    (tmp_path / "c.json").write_text(json.dumps({"workers": 2}))
    assert load_config_file(tmp_path / "c.json") == {"workers": 2}
    (tmp_path / "bad.json").write_text('{"workers": ')
    with pytest.raises(ConfigError, match="is corrupt"):
        load_config_file(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match="table/object"):
        load_config_file(tmp_path / "list.json")
    with pytest.raises(ConfigError, match="No such file"):
        load_config_file(tmp_path / "missing.json")


def test_parse_fault():
    f = parse_fault("2:30:kill")
    assert (f.rank, f.step, f.kind) == (2, 30, "kill")


def test_compression_with_a_decentralized_sync_is_refused():
    with pytest.raises(ConfigError, match="--sync bsp only"):
        TrainConfig(workload="digits-cnn", sync="hop", compress="fp16")
    TrainConfig(workload="digits-cnn", sync="bsp", compress="fp16")


@pytest.mark.parametrize("values,message", [
    ({"backend": "nccl"}, "--backend must be gloo or dlcomm"),
    ({"backend": "dlcomm", "sync": "hop"}, "--backend dlcomm takes --sync bsp"),
    ({"backend": "dlcomm", "compress": "fp16"}, "compressed exchange instead"),
])
def test_backend_choices(values, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**values)
