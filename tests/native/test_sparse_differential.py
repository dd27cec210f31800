"""The native dataplane's sparse rounds against the Python specification: live workers
(the pure sparse state machines) sum tensors of every sparsity pattern through a switch
whose every datagram also goes to the native core, with loss, duplication and reordering;
both must send byte-identical datagrams and count alike, and the sums must be the dense
exchange's bit for bit. The fuzz mutator's sparse rounds, forgeries and bent packets too."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcomm.testing.fakenet import NetConfig, aggregate
from dlcomm.testing.fuzz import FuzzTarget, Mutator
from dlcomm.wire.auth import AUTH_ENCRYPT, AUTH_MAC, AUTH_NONE
from tests.native.test_dataplane_differential import STRANGER, addresses, check_state, compare
from tests.native.twins import Tee, Twins, needs_native
from tests.switch.test_sparse import sparse_inputs

pytestmark = needs_native


def tee_aggregate(xs, k, window, **kw):
    tees: list[Tee] = []

    def make(table):
        tees.append(Tee(table))
        return tees[-1]

    try:
        result = aggregate(xs, k, window, dataplane=make, **kw)
        assert all(t.counters_agree() for t in tees)
        return result, sum(t.compared for t in tees)
    finally:
        for t in tees:
            t.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 5), length=st.integers(0, 4000), b=st.sampled_from([4, 32, 64]),
       m=st.integers(1, 40), window=st.integers(1, 4),
       pattern=st.sampled_from(["shared", "independent", "disjoint", "zeros", "one"]),
       density=st.sampled_from([0.01, 0.1, 0.5, 1.0]), loss=st.sampled_from([0, 0.1]),
       auth=st.sampled_from([AUTH_NONE, AUTH_MAC, AUTH_ENCRYPT]), seed=st.integers(0, 99))
def test_sparse_rounds_agree_packet_for_packet(n, length, b, m, window, pattern, density, loss,
                                               auth, seed):
    k = m * b
    xs = sparse_inputs(n, length, b, pattern, density, seed)
    dense = aggregate(xs, k, window)
    sparse, compared = tee_aggregate(
        xs, k, window, sparse_block=b, auth=auth,
        net=NetConfig(loss=loss, duplicate=loss / 2, jitter_s=1e-3, seed=seed))
    assert sparse.errors == [None] * n
    assert compared > 0 or length == 0
    for d, s in zip(dense.outputs, sparse.outputs):
        assert d.tobytes() == s.tobytes()


def test_long_look_aheads_and_dense_runs():
    """Groups beyond one look-ahead (64 per position), planned rounds of many groups and
    dense runs in between: the planner's every branch, on a larger tensor."""
    xs = sparse_inputs(3, 200_000, 32, "independent", 0.3, 5)
    ys = sparse_inputs(3, 200_000, 32, "shared", 1.0, 6)
    for inputs in (xs, ys, [x + y for x, y in zip(xs, ys)]):
        dense = aggregate(inputs, 32 * 33, 3)
        sparse, _ = tee_aggregate(inputs, 32 * 33, 3, sparse_block=32)
        assert [s.tobytes() for s in sparse.outputs] == [d.tobytes() for d in dense.outputs]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), auth=st.sampled_from([AUTH_NONE, AUTH_MAC, AUTH_ENCRYPT]),
       keys=st.booleans(), m=st.sampled_from([1, 4, 33]))
def test_the_fuzz_mutator_on_a_sparse_job(seed, auth, keys, m):
    """Announce and planned rounds, bent look-aheads, forged masks, unplanned groups and
    blocks, values out of range, probes and resends of sparse results."""
    twins = Twins()
    try:
        job = twins.register(addresses(0, 3), 4, 8 * m, auth, block=8)
        dense = twins.register(addresses(1, 2), 2, 16, AUTH_MAC)
        twins.live(job)
        twins.live(dense)
        from tests.switch.crew import Crew

        crew = Crew(job)
        mutator = Mutator(FuzzTarget(job.job_id, 3, 4, 8 * m, 8,
                                     tuple(crew.channels) if keys else ()), seed)
        for i in range(400):
            datagram, rank = mutator.next()
            src = job.addresses[rank] if rank >= 0 else STRANGER
            compare(twins, datagram, src, now=i * 0.003)
        check_state(twins, 1.2)
    finally:
        twins.close()
