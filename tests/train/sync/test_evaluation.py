"""Evaluation points over asynchronous timelines, step spread, the GG service on sockets."""

from __future__ import annotations

import threading

import pytest

from dlcomm.errors import ExchangeTimeout
from dlcomm.train.common import StepRecord
from dlcomm.train.sync.evaluation import eval_points
from dlcomm.train.sync.prague import GroupBuffer, RandomGroups
from dlcomm.train.sync.report import SyncReport, max_step_spread
from dlcomm.train.sync.service import GroupClient, GroupService

TOKEN = "5" * 32


def test_eval_points_follow_the_mean_step_count():
    fast = [0.1, 0.2, 0.3, 0.4]                 # one worker twice as fast as the other
    slow = [0.2, 0.4]
    assert eval_points([fast, slow], 1) == [(0.2, 1), (0.3, 2), (0.4, 3)]
    assert eval_points([fast, slow], 2) == [(0.3, 2)]
    assert eval_points([[], []], 1) == []


def test_max_step_spread_ignores_finished_workers():
    assert max_step_spread([[1, 2, 3], [1, 2, 3]]) <= 1
    assert max_step_spread([[0.1, 0.2, 0.3, 0.4], [0.35]]) == 3
    assert max_step_spread([[0.1], [0.5, 0.6, 0.7, 0.8]]) == 1   # rank 0 stopped at 0.1


def test_run_summary_collects_gaps_rates_and_own_accuracy():
    reports = []
    for rank in range(2):
        r = SyncReport(rank, protocol="hop", end_time_s=2.0, gaps={"1": rank + 1},
                       own_final={"accuracy": 0.9 + 0.02 * rank})
        r.steps = [StepRecord(i, 0, 0.5 * (i + 1), 1.0, 0.5, 0.1, 10, 10) for i in range(4)]
        reports.append(r)
    reports[0].evals = [{"step": 4, "accuracy": 0.9, "consensus_distance": 0.25}]
    s = reports[0].run_summary(reports)
    assert s["max_iteration_gap"] == 2 and s["final_consensus_distance"] == 0.25
    assert s["steps_per_s"]["min"] == 2.0 and s["own_final_accuracy"]["min"] == 0.9
    assert reports[1].summary()["sync"]["max_gap"] == 2


def test_group_service_over_sockets():
    service = GroupService(RandomGroups(3, 2, seed=4), "127.0.0.1", TOKEN)
    clients = [GroupClient(service.address, r, timeout_s=5, token=TOKEN) for r in range(3)]
    try:
        g0 = clients[0].ask(1, final=False)
        assert 0 in g0.members and len(g0.members) == 2
        partner = [m for m in g0.members if m != 0][0]
        assert clients[partner].ask(1, final=False) == g0
        assert clients[0].ask(2, final=True) is None          # the end
        assert all(clients[r].ask(3, final=False) is None for r in range(3) if r != 0)
    finally:
        for c in clients:
            c.close()
        service.close()
    assert service.error is None


def test_group_service_buffer_window_and_client_deadline():
    service = GroupService(GroupBuffer(3, 3, window_s=0.05), "127.0.0.1", TOKEN)
    clients = [GroupClient(service.address, r, timeout_s=2, token=TOKEN) for r in (0, 1)]
    # rank 2 connects only below: a second hello for a connected rank would be refused
    try:
        got = {}
        threads = [threading.Thread(target=lambda r=r: got.__setitem__(r, clients[r].ask(1, False)))
                   for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert got[0] == got[1] and got[0].members == (0, 1)  # divided after 50 ms
        lonely = GroupClient(service.address, 2, timeout_s=0.3, token=TOKEN)
        with pytest.raises(ExchangeTimeout, match="waited 0.3 s for a group"):
            lonely.ask(1, final=False)                       # nobody else is ready
        lonely.close()
    finally:
        for c in clients:
            c.close()
        service.close()
