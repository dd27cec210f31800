"""Rank grids, placement and per-iteration communication time on topologies."""

import numpy as np
import pytest

from dlcomm.errors import ConfigError
from dlcomm.plan import collectives as coll
from dlcomm.plan.commtime import comm_times, group_ranks, place_ranks
from dlcomm.plan.flownet import FlowNet
from dlcomm.plan.topology import build_topology
from dlcomm.plan.traffic import Comm, Parallelism


def test_group_ranks_partition_the_grid():
    par = Parallelism(dp=4, pp=2, tp=2, ep=2)
    for dim, size in (("tp", 2), ("pp", 2), ("dp", 4), ("ep", 2), ("dp-expert", 2)):
        g = group_ranks(par, dim)
        assert g.shape == (16 // size, size)
        assert sorted(g.ravel()) == list(range(16))
    assert group_ranks(par, "tp")[0].tolist() == [0, 1]
    assert group_ranks(par, "pp")[0].tolist() == [0, 2]
    assert group_ranks(par, "dp")[0].tolist() == [0, 4, 8, 12]
    assert group_ranks(par, "ep")[0].tolist() == [0, 4]


def test_placement():
    par = Parallelism(dp=8)
    assert place_ranks(par, 16).tolist() == list(range(8))
    random = place_ranks(par, 16, "random", seed=3)
    assert len(set(random.tolist())) == 8 and random.tolist() != list(range(8))
    with pytest.raises(ConfigError, match="needs 8"):
        place_ranks(par, 4)
    with pytest.raises(ConfigError, match="placement"):
        place_ranks(par, 16, "snake")


def time_of(spec, comms, par, placement="linear"):
    topo = build_topology(spec)
    return comm_times(topo, FlowNet.from_graph(topo.graph()), comms, par, placement)


def test_data_parallel_allreduce_on_a_fat_tree_is_the_closed_form():
    par = Parallelism(dp=64)
    (t,) = time_of("fattree:n=64,radix=16", [Comm("dp", "allreduce", 64, 1e8, 1)], par)
    closed = build_topology("fattree:n=64,radix=16").best_allreduce(1e8, 1e-6)
    assert t.seconds == pytest.approx(closed.seconds, rel=0.05)


def test_placement_matters_on_a_mesh_not_on_a_fat_tree():
    par = Parallelism(dp=16, tp=4)
    comms = [Comm("tp", "allreduce", 4, 5e7, 100)]
    mesh = "hxmesh:a=2,b=2,x=4,y=4"
    linear = time_of(mesh, comms, par)[0].seconds
    scattered = time_of(mesh, comms, par, "random")[0].seconds
    assert scattered > 1.5 * linear
    tree = [time_of("fattree:n=64,radix=16", comms, par, p)[0].seconds
            for p in ("linear", "random")]
    assert tree[0] == pytest.approx(tree[1], rel=0.05)


def test_alltoall_sampling_is_close_to_exact(monkeypatch):
    from dlcomm.plan import commtime

    par = Parallelism(dp=64, ep=32)
    comms = [Comm("ep", "alltoall", 32, 1e7, 4)]
    for spec in ("torus2d:x=8,y=8", "hxmesh:a=2,b=2,x=4,y=4"):
        exact = time_of(spec, comms, par)[0]
        monkeypatch.setattr(commtime, "SAMPLE_FLOWS", 1024)       # 16 of 31 offsets
        sampled = time_of(spec, comms, par)[0]
        monkeypatch.undo()
        assert "sampled 16 of 31" in sampled.algorithm and "sampled" not in exact.algorithm
        assert sampled.seconds == pytest.approx(exact.seconds, rel=0.3)


def test_whole_machine_alltoall_and_pipeline():
    par = Parallelism(dp=64)
    (a2a,) = time_of("fattree:n=64,radix=16", [Comm("embedding", "alltoall", 64, 64e6, 2)], par)
    # non-blocking: every rank's 63/64 of 64 MB at 1600 Gb/s
    assert a2a.seconds_per_call == pytest.approx(63 * 1e-6 + 63e6 / 200e9, rel=1e-6)
    par = Parallelism(dp=16, pp=4)
    (pp,) = time_of("torus2d:x=8,y=8", [Comm("pp", "p2p", 4, 1e6, 16)], par)
    # neighbours on one 400 Gb/s link each
    assert pp.seconds_per_call == pytest.approx(coll.p2p(1e6, 1e-6, 8 / 400e9))
    assert np.isfinite(pp.seconds)
