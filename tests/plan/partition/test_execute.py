"""Executed plans on 2-4 local gloo ranks: same gradients as one process, model's bytes."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest

from dlcomm.errors import ConfigError, WorkerFailed
from dlcomm.plan.partition.devices import make_cluster
from dlcomm.plan.partition.execute import ExecPlan, Execution, execute, integer_splits
from dlcomm.plan.partition.execute.launch import run_job
from dlcomm.plan.partition.execute.model import executable_table
from dlcomm.plan.partition.execute.worker import table_to_dict
from dlcomm.plan.partition.graph import build_graph
from dlcomm.plan.partition.hierarchy import PlanOptions, plan
from tests.plan.partition.tables import mlp, tiny_resnet

I, II, III = 0, 1, 2
# ten layers whose consecutive types visit all nine (previous, current) transitions
ALL_PAIRS = [I, I, II, II, III, III, I, III, II, I]
BATCH = 8


@pytest.fixture
def in_job_tmp(job_tmp, monkeypatch):
    """Job directories (and so the workers' command lines) under the test's directory."""
    monkeypatch.setattr(tempfile, "tempdir", str(job_tmp))
    return job_tmp


def _plan(table, types, shares, slowdowns):
    g = build_graph(executable_table(table))
    return ExecPlan(types, integer_splits(g, types, np.array(shares), BATCH), slowdowns)


def _check(runs: list[Execution]) -> None:
    for run in runs:
        assert run.grad_scale > 0.05                     # gradients are not vanishing
        assert run.max_grad_error <= 1e-5, run.plan
        assert run.gradients_match
        assert run.mismatches() == [], run.plan
        moved = sum(sum(v) for rank in run.measured for v in rank.values())
        assert moved > 0


def test_two_ranks_every_transition_and_join(in_job_tmp):
    mlp10 = mlp([12, 16, 20, 16, 12, 16, 20, 12, 16, 8, 6], bias=True)
    resnet = tiny_resnet()
    g = build_graph(executable_table(resnet))
    # the planner's own heterogeneous plan (TPU-v2 + TPU-v3, one level), executed as is
    planned = plan(g, make_cluster("tpu-v2:1,tpu-v3:1"), "accpar",
                   PlanOptions(batch=BATCH, hierarchy="flat"))
    types = [int(t) for t in planned.root.types]
    runs = execute(mlp10, [_plan(mlp10, ALL_PAIRS, [[0.3, 0.7]] * 10, [2.0, 1.0])],
                   batch=BATCH, steps=2)
    runs += execute(resnet, [
        ExecPlan(types, integer_splits(g, types, planned.root.shares, BATCH), [123 / 45, 1.0]),
        _plan(resnet, [III, I, III, II, I, III, II, III], [[0.4, 0.6]] * 8, [1.0, 1.0]),
        _plan(resnet, [I, II, I, III, III, II, I, II], [[0.75, 0.25]] * 8, [1.0, 1.5]),
    ], batch=BATCH, steps=2)
    _check(runs)
    assert runs[0].plan.splits[0] == [2, 6]                 # 30/70 of the batch of 8
    # the single-process loss goes down with SGD, so the steps really trained
    assert runs[0].losses[1] < runs[0].losses[0]


@pytest.mark.parametrize("world", [3, 4])
def test_more_ranks_uneven_and_empty_parts(in_job_tmp, world):
    resnet = tiny_resnet()
    rng = np.random.default_rng(world)
    plans = []
    for _ in range(2):
        types = [int(t) for t in rng.integers(0, 3, 8)]
        shares = rng.dirichlet(np.full(world, 3.0), size=8)
        plans.append(_plan(resnet, types, shares, [1.0] * world))
    # conv1 has 3 input channels: type II over 4 ranks leaves one rank an empty slice
    plans.append(_plan(resnet, [II, III, I, II, III, I, II, III], [[0.25] * 4] * 8
                       if world == 4 else [[1 / 3] * 3] * 8, [1.0] * world))
    runs = execute(resnet, plans, batch=BATCH, steps=1)
    _check(runs)


def test_float64_runs_match_to_rounding(in_job_tmp):
    """In float64 the partitioned sums agree with one process to 1e-12: the algorithm is
    exact, and the float32 differences are rounding (8 bytes per element are counted)."""
    resnet = tiny_resnet()
    plans = [_plan(resnet, [III, II, III, I, II, III, II, III], [[0.3, 0.7]] * 8, [1.0, 1.0])]
    (run,) = execute(resnet, plans, batch=BATCH, steps=1, dtype="float64", tolerance=1e-12)
    assert run.gradients_match and run.bytes_match and run.bytes_per_element == 8


def test_a_wrong_byte_count_is_reported():
    run = Execution(ExecPlan([0], [[4, 4]], [1.0, 1.0]), 2, 0.0, 1e-5,
                    [{"intra0": (10, 10)}, {"intra0": (10, 10), "edge3": (1, 0)}],
                    {"intra0": ([5, 5], [5, 5])})
    assert run.mismatches() == ["rank 1 edge3: measured (1, 0), model (0, 0)"]
    assert not run.bytes_match


def test_a_failing_rank_stops_the_job(in_job_tmp):
    table = mlp([4, 6, 3])
    job = {"table": table_to_dict(table), "batch": 4, "steps": 2, "seed": 0, "lr": 0.1,
           "fail_rank": 1, "plans": [{"types": [0, 0], "splits": [[2, 2], [2, 2]],
                                      "slowdowns": [1.0, 1.0]}]}
    with pytest.raises(WorkerFailed, match="rank 1 failed: RuntimeError: injected failure"):
        run_job(job, 2, timeout_s=30)


def test_bad_plans_are_refused():
    table = mlp([4, 6, 3])
    with pytest.raises(ConfigError, match="needs 2 layers"):
        execute(table, [ExecPlan([0], [[2, 2]], [1.0, 1.0])], batch=4)
    with pytest.raises(ConfigError, match="cover its dimension"):
        execute(table, [ExecPlan([0, 1], [[2, 1], [3, 3]], [1.0, 1.0])], batch=4)
    emb = table.layers[0].__class__("emb", "embedding", 10, 0.0, 1, 4, 10, 4)
    with pytest.raises(ConfigError, match="cannot execute"):
        executable_table(table.__class__("t", "mlp", (emb, *table.layers), "", 0, "", 1))
