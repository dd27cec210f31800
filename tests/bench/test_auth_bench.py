"""``dlcomm bench auth``: every primitive and every channel mode measured, JSON written."""

from __future__ import annotations

import json

from dlcomm.bench.auth import measure_auth
from tests.conftest import run_dlcomm


def test_every_primitive_and_mode_is_measured():
    s = measure_auth(elements=64, count=5, repeats=2)["summary"]
    assert s["datagram_bytes"] == 32 + 4 * 64 + 16
    assert set(s["primitives_us"]) == {"aes_gcm_tag", "aes_gcm_check", "aes_gcm_encrypt",
                                       "hmac_sha256", "blake2b_keyed"}
    assert set(s["channel_us"]) == {"none", "authenticated", "encrypted"}
    assert all(v > 0 for d in s["channel_us"].values() for v in d.values())


def test_the_command_writes_json_and_refuses_bad_counts(tmp_path):
    out = tmp_path / "a.json"
    res = run_dlcomm("bench", "auth", "--elements", "64", "--count", "5", "--repeats", "1",
                     "--json", str(out), tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["kind"] == "bench-auth"
    res = run_dlcomm("bench", "auth", "--count", "0", tmp=tmp_path)
    assert res.returncode != 0
    assert res.stderr.strip() == "dlcomm: error: --elements, --count and --repeats must be >= 1"
