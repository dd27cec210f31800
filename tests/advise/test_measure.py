"""``advise --measure``'s fits and the calibration file (pure; the measuring runs in the
slow CLI test)."""

import json

import pytest

from dlcomm.advise.cost import Candidate, Cluster, Constants, bucket_time, load_constants
from dlcomm.advise.main import cpu_factor, emulation_dilation
from dlcomm.advise.measure import SPARSE_DENSITIES, SPARSE_SIZE, constants_from, fit_line
from dlcomm.advise.profile import JobProfile
from dlcomm.advise.run import machine_factor
from dlcomm.errors import ConfigError

MB = 2**20


def test_fit_line_recovers_a_line_and_says_how_far_it_is():
    a, b, err = fit_line([(x, 0.002 + 3e-9 * x) for x in (16e3, 2e6, 8e6)])
    assert a == pytest.approx(0.002) and b == pytest.approx(3e-9) and err < 1e-9
    a, b, err = fit_line([(1e3, 1.0), (2e3, 1.0), (3e3, 2.0)])
    assert err > 0.1
    # no fixed cost to be seen: forced through the origin, never negative
    a, b, _ = fit_line([(1e6, 0.001), (2e6, 0.003)])
    assert a == 0.0 and b > 0
    with pytest.raises(ConfigError, match="two different sizes"):
        fit_line([(1e6, 1.0), (1e6, 2.0)])
    with pytest.raises(ConfigError, match="at least two"):
        fit_line([(1e6, 1.0)])


def synthetic(k: Constants, n: int, f: float) -> dict:
    """Loopback times as the cost model says they would be with constants ``k``."""
    sizes = (16 * 1024, 2 * MB, 8 * MB)
    ring = [(s, 2 * (n - 1) * f * k.ring_alpha_s + f * 2 * (n - 1) / n * 8 * s
             / k.ring_rate_bps) for s in sizes]
    switch = [(s, f * k.switch_overhead_s + f * n * 8 * s / k.switch_rate_bps) for s in sizes]
    s = SPARSE_SIZE
    sparse = [(d, f * k.switch_overhead_s + f * (8 * s / k.scan_rate_bps
                                                 + 8 * s * d / k.sparse_rate_bps))
              for d in SPARSE_DENSITIES]
    comp = [(sizes[0], ring[0][1] + f * k.round_s)]
    powersgd = [(sizes[0], 2 * (switch[0][1] + f * k.switch_round_s))]
    return {"ring": ring, "switch": switch, "compressed:method=fp16,over=ring": comp,
            "compressed:method=powersgd:rank=4,over=switch": powersgd}, sparse


def test_constants_from_inverts_the_cost_model():
    truth = Constants(ring_alpha_s=2e-4, ring_rate_bps=5e9, switch_overhead_s=1e-3,
                      switch_rate_bps=20e9, sparse_rate_bps=1e9, scan_rate_bps=30e9, round_s=2e-3,
                      switch_round_s=0.4e-3)
    loopback, sparse = synthetic(truth, 4, 2.0)
    k, details = constants_from(loopback, sparse, 4, 2.0)
    assert k.source == "measured" and details["fit_error"] < 1e-6
    for name in ("ring_alpha_s", "ring_rate_bps", "switch_overhead_s", "switch_rate_bps",
                 "sparse_rate_bps", "scan_rate_bps", "round_s", "switch_round_s"):
        assert getattr(k, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    # the client keeps its ratio to the switch; efficiencies come only from the links
    assert k.client_rate_bps / k.switch_rate_bps == pytest.approx(0.8)
    assert k.ring_efficiency == Constants().ring_efficiency
    # the Python dataplane serves only jobs of more than 64 workers: not measured here
    assert k.python_switch_rate_bps == Constants().python_switch_rate_bps
    k2, _ = constants_from(loopback, sparse, 4, 2.0, links={"ring_efficiency": 0.7})
    assert k2.ring_efficiency == 0.7


def test_a_calibration_file_round_trips_and_bad_ones_are_one_line(tmp_path):
    k = Constants(ring_alpha_s=1e-4, source="measured")
    advise = tmp_path / "advise.json"
    advise.write_text(json.dumps({"kind": "advise", "config": {"constants": k.to_dict()}}))
    assert load_constants(str(advise)) == k
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"ring_rate_bps": 3e9}))
    assert load_constants(str(bare)).ring_rate_bps == 3e9
    for text, message in (("{", "cannot read"), ('{"warp": 1}', "unknown constant 'warp'"),
                          ('{"ring_rate_bps": 0}', "finite number > 0"),
                          ('{"ring_alpha_s": -1}', "finite number >= 0"),
                          ('{"ring_efficiency": 1.5}', r"in \(0, 1\]"),
                          ('{"ring_rate_bps": "fast"}', "finite number > 0"),
                          ("[1]", "holds no constants"), ("{}", "holds no constants")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_constants(str(bad))
    with pytest.raises(ConfigError, match="no such file"):
        load_constants(str(tmp_path / "missing.json"))


def test_cpu_costs_follow_the_hosts():
    # a catalog model is predicted as its time-dilated emulation runs it: shared cores / K
    k = Constants()
    assert emulation_dilation(10e9, 8, k) == 10.0  # 0.3 x 30 Gbit/s over 8 links
    assert cpu_factor(8, None, 10.0, False) == pytest.approx(machine_factor(8) / 10)
    assert cpu_factor(8, 4.0, 10.0, False) == 0.25     # hosts named: nothing else counts
    assert cpu_factor(4, None, None, False) == 1.0     # scaled to an accelerator
    assert cpu_factor(8, None, None, True) == machine_factor(8)  # measured here
    with pytest.raises(ConfigError, match="--host-speedup must be positive"):
        cpu_factor(4, 0.0, None, True)
    profile = JobProfile("toy", 0.0, 0.0, 0.0, (), 1.0)
    slow, _ = bucket_time(8 * MB, Candidate("ring"), profile, Cluster(4, 1e12), k)
    fast, _ = bucket_time(8 * MB, Candidate("ring"), profile,
                          Cluster(4, 1e12, cpu_factor=0.1), k)
    assert fast == pytest.approx(slow / 10)  # CPU-bound at 1 Tbit/s: every term is CPU
