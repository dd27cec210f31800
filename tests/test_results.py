import json

import pytest

from dlcomm.errors import ConfigError
from dlcomm.results import (
    SCHEMA,
    check_writable,
    new_result,
    validate_result,
    write_atomic,
    write_json,
)


def test_new_result_has_versions_and_host():
    res = new_result("train", {"workers": 2})
    assert res["schema"] == SCHEMA and res["config"]["workers"] == 2
    assert {"torch", "python", "dlcomm"} <= set(res["config"]["versions"])
    assert res["config"]["host"]["cpus"] >= 1


def test_write_json_is_atomic_and_nan_free(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"a": float("nan"), "b": [1.0, float("inf")]})
    assert json.loads(path.read_text()) == {"a": None, "b": [1.0, None]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "r.json"

    def boom(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(path, boom)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_previous_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        write_atomic(path, lambda tmp: (_ for _ in ()).throw(RuntimeError("x")))
    assert path.read_text() == "old"


def test_check_writable(tmp_path):
    assert check_writable(None) is None
    assert check_writable(tmp_path / "x.json") == tmp_path / "x.json"
    with pytest.raises(ConfigError, match="does not exist"):
        check_writable(tmp_path / "missing" / "x.json")
    with pytest.raises(ConfigError, match="is a directory"):
        check_writable(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_validate_result():
    res = new_result("train", {})
    with pytest.raises(ValueError, match="summary lacks"):
        validate_result(res)
    res["summary"] = dict.fromkeys(("final_loss", "steps", "time_per_step_s",
                                    "comm_wait_per_step_s", "bytes_sent_per_worker",
                                    "bytes_received_per_worker"), 0)
    validate_result(res)
    with pytest.raises(ValueError, match="schema"):
        validate_result({**res, "schema": "other/9"})
