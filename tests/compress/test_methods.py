"""The mathematics of every compressor and memory, without a network."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.compress import COMPRESSORS, MEMORIES, make_compressor, make_memory, run_local
from dlcomm.compress.packing import (
    decode_payload,
    encode_payload,
    lane_bits,
    lanes_per_word,
    pack_lanes,
    pack_signs,
    unpack_lane_sums,
    unpack_signs,
)
from dlcomm.compress.powersgd import orthogonalize, plan_layout
from dlcomm.errors import ConfigError, RegistryError
from dlcomm.exchange.compressed.exchange import check_world
from tests.compress.simulate import simulate

ALL = ["none", "fp16", "bf16", "topk", "randomk", "threshold", "dgc", "qsgd", "terngrad",
       "signsgd", "signum", "efsignsgd", "onebit", "natural", "powersgd", "u8bit"]


def gaussian(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def test_registry_holds_the_sixteen_methods_and_four_memories():
    assert sorted(COMPRESSORS.names()) == sorted(ALL)
    assert sorted(MEMORIES.names()) == ["dgc", "none", "powersgd", "residual"]


@pytest.mark.parametrize("name", ALL)
def test_round_trip_shape_and_payload_size(name):
    x = gaussian(4099)
    approx, payload = run_local(make_compressor(name), x)
    assert approx.shape == x.shape and approx.dtype == torch.float32
    nbytes = sum(t.numel() * t.element_size() for t in payload)
    if name in ("none", "threshold"):
        return
    assert nbytes < x.numel() * 4, (name, nbytes)


@pytest.mark.parametrize("spec", ["qsgd", "qsgd:norm=inf,levels=4", "terngrad", "natural",
                                  "randomk:ratio=0.25", "u8bit"])
def test_unbiased_in_expectation(spec):
    """E[decompress(compress(x))] = x: the mean of K draws is within 5 standard errors."""
    x = torch.tensor([3.0, -1.5, 0.25, -0.6, 0.0, 1.1, -7.0, 0.5, -0.3, 0.05] * 2)
    c = make_compressor(spec)
    draws = torch.stack([run_local(c, x, name="t")[0] for _ in range(1500)])
    mean, std = draws.mean(0), draws.std(0)
    bound = 5 * std / math.sqrt(len(draws)) + 1e-6
    assert torch.all((mean - x).abs() <= bound), (spec, mean - x, bound)
    assert std.max() > 0  # really random, not exact


def test_biased_nearest_u8bit_is_deterministic_and_within_half_a_level():
    x = gaussian(1000, 3)
    a1, _ = run_local(make_compressor("u8bit:stochastic=0"), x)
    a2, _ = run_local(make_compressor("u8bit:stochastic=0"), x)
    assert torch.equal(a1, a2)
    assert (a1 - x).abs().max() <= x.abs().max() / 254 + 1e-6


@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.3, 1.0])
def test_topk_picks_the_true_top_k(ratio):
    x = gaussian(5000, 1)
    values, indices = make_compressor(f"topk:ratio={ratio}").compress(x, "t")[0]
    k = max(1, math.ceil(ratio * x.numel()))
    expected = set(torch.argsort(x.abs(), descending=True)[:k].tolist())
    assert set(indices.tolist()) == expected
    assert torch.equal(values, x[indices.long()])


def test_threshold_keeps_exactly_the_large_elements():
    x = gaussian(3000, 2)
    values, indices = make_compressor("threshold:tau=1.5").compress(x, "t")[0]
    assert set(indices.tolist()) == set(torch.nonzero(x.abs() >= 1.5).flatten().tolist())


def test_dgc_keeps_a_top_set_of_about_ratio():
    x = gaussian(200_000, 4)
    _, indices = make_compressor("dgc:ratio=0.01").compress(x, "t")[0]
    kept = torch.zeros(x.numel(), dtype=torch.bool)
    kept[indices.long()] = True
    assert x[kept].abs().min() >= x[~kept].abs().max()      # a top set
    assert 0.5 * 2000 <= indices.numel() <= 1.3 * 2000       # near k, at most 1.3 k


def test_randomk_indices_are_shared_and_distinct():
    a, b = make_compressor("randomk:ratio=0.1"), make_compressor("randomk:ratio=0.1")
    (_, ctx_a), (_, ctx_b) = a.compress(gaussian(1000), "t"), b.compress(gaussian(1000, 9), "t")
    assert torch.equal(ctx_a[1], ctx_b[1]) and len(set(ctx_a[1].tolist())) == 100
    (_, again) = a.compress(gaussian(1000), "t")
    assert not torch.equal(again[1], ctx_a[1])  # a new draw every call


def test_sign_majority_vote():
    xs = [torch.tensor([1.0, -1.0, 2.0, -3.0, 0.5]), torch.tensor([1.0, 1.0, -2.0, -3.0, -0.5]),
          torch.tensor([-1.0, 1.0, -2.0, 3.0, -0.5])]
    total = simulate([make_compressor("signsgd") for _ in xs], xs)
    # votes: (+,+,-), (-,+,+), (+,-,-), (-,-,+), (+,-,-) -> majorities x 3 workers
    assert total.tolist() == [3.0, 3.0, -3.0, -3.0, -3.0]
    tie = simulate([make_compressor("signsgd") for _ in range(2)],
                   [torch.tensor([1.0, -1.0]), torch.tensor([-1.0, -1.0])])
    assert tie.tolist() == [0.0, -2.0]


def test_signum_votes_on_local_momentum():
    c = make_compressor("signum:momentum=0.5")
    first, _ = run_local(c, torch.tensor([1.0, -1.0]))
    second, _ = run_local(c, torch.tensor([-0.5, 0.4]))  # m = 0.5*m + 0.5*x
    assert first.tolist() == [1.0, -1.0] and second.tolist() == [1.0, -1.0]
    third, _ = run_local(c, torch.tensor([-3.0, 3.0]))
    assert third.tolist() == [-1.0, 1.0]


def test_efsignsgd_and_onebit_reconstruction_values():
    x = torch.tensor([2.0, -1.0, 4.0, -3.0])
    ef, _ = run_local(make_compressor("efsignsgd"), x)
    assert ef.tolist() == [2.5, -2.5, 2.5, -2.5]            # ||x||_1 / d = 2.5
    ob, _ = run_local(make_compressor("onebit"), x)
    assert ob.tolist() == [3.0, -2.0, 3.0, -2.0]            # class means


@pytest.mark.parametrize("spec", ["topk:ratio=0.05", "qsgd", "onebit", "efsignsgd",
                                  "threshold:tau=0.5", "natural", "powersgd:rank=2"])
def test_error_feedback_conserves_the_sum(spec):
    """Sum over steps of what was sent + the final residual = sum of the gradients."""
    c, memory = make_compressor(spec), make_memory("residual")
    sent, grads = torch.zeros(2048, dtype=torch.float64), torch.zeros(2048, dtype=torch.float64)
    for step in range(12):
        g = gaussian(2048, 100 + step)
        grads += g.double()
        p = memory.compensate(g, "t")
        local, _ = run_local(c, p, name="t")
        memory.update(p, "t", local, local)
        sent += local.double()
    torch.testing.assert_close(sent + memory.residuals["t"].double(), grads, rtol=0, atol=1e-4)


def test_dgc_memory_corrects_momentum_and_masks_what_was_sent():
    memory = make_memory("dgc:momentum=0.5")
    g = torch.tensor([1.0, 2.0, 3.0, 4.0])
    v = memory.compensate(g, "t")                              # u = g, v = g
    sent = torch.tensor([0.0, 0.0, 0.0, 4.0])
    memory.update(v, "t", sent, sent)
    v2 = memory.compensate(g, "t")             # u = 0.5 u + g with u[3] masked to 0; v += u
    assert v2.tolist() == [1.0 + 1.5, 2.0 + 3.0, 3.0 + 4.5, 0.0 + 4.0]


def test_powersgd_memory_keeps_local_minus_average():
    memory = make_memory("powersgd")
    p = memory.compensate(torch.tensor([1.0, 2.0]), "t")
    memory.update(p, "t", None, torch.tensor([0.5, 0.5]))
    assert memory.compensate(torch.tensor([0.0, 0.0]), "t").tolist() == [0.5, 1.5]


@pytest.mark.parametrize("spec", ["residual", "powersgd", "dgc"])
def test_memory_keeps_its_state_in_the_same_tensors_step_after_step(spec):
    """A new residual is written over the old one (no new tensor of the bucket's size each
    step: a large bucket pays for fresh pages), with the same values as a fresh one."""
    memory, state = make_memory(spec), {"residual": "residuals", "powersgd": "residuals",
                                        "dgc": "v"}[spec]
    sent = torch.tensor([0.5, 0.0, -1.0])
    p = memory.compensate(torch.tensor([1.0, 2.0, 3.0]), "t")
    memory.update(p, "t", sent, sent)
    first = getattr(memory, state)["t"]
    for step in range(3):
        p = memory.compensate(torch.tensor([1.0, 2.0, 3.0]) * step, "t")
        memory.update(p, "t", sent, sent)
        kept = getattr(memory, state)["t"]
        assert kept.data_ptr() == first.data_ptr()
        assert torch.equal(kept, p - sent) and kept.data_ptr() != p.data_ptr()


def _run_rounds(compressor, flat, name):
    protocol = compressor.rounds(flat, name, 1)
    request = next(protocol)
    with pytest.raises(StopIteration) as done:
        while True:
            request = protocol.send([t.clone() for t in request.tensors])
    return done.value.value


def test_powersgd_on_a_flat_bucket_leaves_it_and_sums_in_a_buffer_it_keeps():
    """The flat fallback copies the bucket into a padded matrix it keeps per bucket, writes
    P Q^T over it and scales it to the sum there: the bucket handed over is not touched,
    the sum is what the factors stand for (as the allocating decompression rebuilds it),
    and the next step reuses the buffer (its padding zero again)."""
    flat = gaussian(1000, 3)  # 32 x 32 padded: 24 elements of padding
    before = flat.clone()
    c = make_compressor("powersgd:rank=2,warm=0")
    outcome = _run_rounds(c, flat, "t")
    assert torch.equal(flat, before)
    assert outcome.total.numel() == 1000 and outcome.total.data_ptr() != flat.data_ptr()
    payload, ctx = make_compressor("powersgd:rank=2,warm=0").compress(flat.clone(), "t")
    torch.testing.assert_close(outcome.total, make_compressor("powersgd:rank=2").decompress(
        payload, ctx), atol=1e-5, rtol=1e-5)
    first = outcome.total.data_ptr()
    other = make_compressor("powersgd:rank=2,warm=0")  # the same second draw of Q, but
    _run_rounds(other, flat, "other")                    # into a fresh buffer
    fresh = _run_rounds(other, flat, "t")
    c.pads["t"].fill_(float("nan"))  # whatever the kept buffer holds does not leak
    again = _run_rounds(c, flat, "t")
    assert again.total.data_ptr() == first != fresh.total.data_ptr()
    torch.testing.assert_close(again.total, fresh.total, atol=1e-5, rtol=1e-5)


def test_memory_is_forgotten_when_sent_exactly():
    memory = make_memory("residual")
    p = memory.compensate(torch.ones(3), "t")
    memory.update(p, "t", torch.zeros(3), torch.zeros(3))
    memory.forget("t")
    assert memory.compensate(torch.ones(3), "t").tolist() == [1.0, 1.0, 1.0]


@settings(max_examples=60, deadline=None)
@given(levels=st.integers(1, 300), world=st.integers(1, 16), count=st.integers(1, 50),
       seed=st.integers(0, 2**31 - 1), word=st.sampled_from([torch.int32, torch.float32]))
def test_packed_lanes_sum_exactly(levels, world, count, seed, word):
    if lane_bits(levels, world) > (31 if word == torch.int32 else 24):
        return
    rng = np.random.default_rng(seed)
    values = [torch.from_numpy(rng.integers(-levels, levels + 1, count)) for _ in range(world)]
    words = [pack_lanes(v, levels, world, word) for v in values]
    total = torch.stack([w.to(torch.float64) for w in words]).sum(0)
    assert total.max() < (2**31 if word == torch.int32 else 2**24)  # exact in the word
    sums = unpack_lane_sums(total.to(word), count, levels, world)
    assert torch.equal(sums, torch.stack(values).sum(0))


def test_lane_counts():
    assert lanes_per_word(127, 4, torch.int32) == 3      # 10-bit lanes
    assert lanes_per_word(127, 4, torch.float32) == 2
    assert lanes_per_word(1, 4, torch.int32) == 7        # ternary: 4-bit lanes
    with pytest.raises(ConfigError):
        lanes_per_word(32767, 1024, torch.float32)


def test_levels_that_cannot_be_summed_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="qsgd"):
        check_world(make_compressor("qsgd:levels=32767"), 1024, torch.float32)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 300))
def test_sign_bits_round_trip(n):
    x = gaussian(n, n)
    signs = unpack_signs(pack_signs(x), n)
    assert torch.equal(signs, torch.where(x >= 0, 1.0, -1.0))


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4), seed=st.integers(0, 100))
def test_payload_bytes_round_trip(sizes, seed):
    dtypes = [torch.float32, torch.uint8, torch.int32, torch.float16, torch.int8]
    payload = [(gaussian(n, seed) * 50).to(dtypes[i % len(dtypes)]) for i, n in enumerate(sizes)]
    buf = encode_payload(payload)
    assert buf.numel() % 8 == 0
    back = decode_payload(buf.clone(), payload)
    assert all(torch.equal(a, b) for a, b in zip(back, payload))


def test_powersgd_layout_follows_torchs_rule():
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    shapes = [torch.Size(s) for s in [(10,), (10, 128), (128, 1024), (64, 32, 3, 3),
                                      (32, 1, 3, 3), (128,)]]
    layout = plan_layout(sum(math.prod(s) for s in shapes), shapes, 4, 2.0)
    compressed = {(b.rows, b.cols) for b in layout.compressed}
    for s in shapes:
        n = s[0]
        m = math.prod(s) // n
        assert ((n, m) in compressed) == _should_compress(n, m, min(n, m, 4), 2.0)[0]


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_orthogonalize_gives_orthonormal_columns(rank):
    m = gaussian(50 * rank, rank).view(50, rank).clone()
    orthogonalize(m)
    torch.testing.assert_close(m.t() @ m, torch.eye(rank), atol=1e-5, rtol=0)


def test_powersgd_recovers_a_low_rank_matrix():
    """A rank-2 matrix is reproduced by rank-2 PowerSGD after a few warm-started steps."""
    u, v = gaussian(40, 1).view(20, 2), gaussian(60, 2).view(30, 2)
    x = (u @ v.t()).reshape(-1)
    c = make_compressor("powersgd:rank=2")
    for _ in range(4):
        outcome = simulate([c], [x], shapes=[torch.Size([20, 30])])[0]
    torch.testing.assert_close(outcome.total, x, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("spec,match", [
    ("topk:ratio=2", "ratio"), ("topk:ratio=x", "ratio"), ("topk:k=3", "no option"),
    ("qsgd:levels=0", "levels"), ("qsgd:norm=1", "norm"), ("powersgd:rank=0", "rank"),
    ("powersgd:start=1", "start must be >= 2"), ("signum:momentum=1", "momentum"),
    ("threshold:tau=-1", "tau")])
def test_bad_specs_are_one_line_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match) as err:
        make_compressor(spec)
    assert "\n" not in str(err.value)


def test_check_specs_before_any_worker_starts():
    from dlcomm.exchange.compressed import check_specs

    check_specs("adaptive:every=3", "residual")
    check_specs("topk:ratio=0.1", "dgc")
    with pytest.raises(ConfigError, match="every"):
        check_specs("adaptive:every=0", "none")
    with pytest.raises(ConfigError, match="candidates"):
        check_specs("adaptive:candidates=none+zip", "none")
    with pytest.raises(RegistryError):
        check_specs("fp16", "forever")


def test_unknown_names():
    with pytest.raises(RegistryError, match="known:"):
        make_compressor("zip")
    with pytest.raises(RegistryError):
        make_memory("forever")
    with pytest.raises(ConfigError, match="adaptive"):
        make_compressor("adaptive")


@pytest.mark.parametrize("spec,n,kept", [
    ("topk:ratio=0.07", 100, 7), ("topk:ratio=0.29", 100, 29), ("topk:ratio=0.57", 100, 57),
    ("topk:ratio=0.015", 1000, 15), ("topk:ratio=0.001", 10, 1), ("topk:ratio=1", 5, 5),
    ("randomk:ratio=0.07", 100, 7), ("randomk:ratio=0.29", 100, 29)])
def test_kept_counts_are_exact_ceilings(spec, n, kept):
    """k = ceil(ratio * n) on the ratio as written: 0.07 * 100 is 7.000000000000001 in floats,
    whose ceiling (8) the old code kept."""
    payload, _ = make_compressor(spec).compress(torch.randn(n), "t")
    assert payload[0].numel() == kept


def test_count_of_matches_the_exact_decimal_ceiling():
    import math
    from fractions import Fraction

    from dlcomm.compress.base import count_of
    for ratio in (0.07, 0.29, 0.57, 0.1, 0.3, 1e-3, 0.999, 0.5):
        for n in (1, 7, 100, 1000, 12345):
            assert count_of(ratio, n) == max(1, min(n, math.ceil(Fraction(str(ratio)) * n)))
