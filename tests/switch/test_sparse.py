"""Sparse streaming aggregation: bit-identical to dense at threshold 0, for any pattern."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcomm.switch.planning import plan_round
from dlcomm.testing.fakenet import NetConfig, aggregate
from dlcomm.wire.sparse import (
    Blocks,
    block_peaks,
    decode,
    encode,
    pack_masks,
    popcount,
    present_blocks,
    unpack_masks,
    zero_absent_blocks,
)


def sparse_inputs(n, length, b, pattern, density, seed):
    rng = np.random.default_rng(seed)
    blocks = -(-length // b)
    shared = rng.random(blocks) < density
    xs = []
    for w in range(n):
        x = rng.standard_normal(length).astype(np.float32)
        keep = {"shared": shared, "independent": rng.random(blocks) < density,
                "disjoint": (np.arange(blocks) % n == w) & shared,
                "zeros": np.zeros(blocks, bool),
                "one": np.arange(blocks) == (blocks - 1 if w == 0 else -1)}[pattern]
        mask = np.repeat(keep, b)[:length]
        x[~mask] = 0.0
        if pattern == "one" and w == 0 and length:
            x[:] = 0.0
            x[length - 1] = 1.5  # a single non-zero element, in the (partial) last block
        xs.append(x)
    return xs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 5), length=st.integers(0, 5000), b=st.sampled_from([4, 32, 64]),
       m=st.integers(1, 6), window=st.integers(1, 5),
       pattern=st.sampled_from(["shared", "independent", "disjoint", "zeros", "one"]),
       density=st.sampled_from([0.01, 0.1, 0.5, 1.0]), loss=st.sampled_from([0, 0.1]),
       seed=st.integers(0, 99))
def test_sparse_equals_dense_bit_for_bit(n, length, b, m, window, pattern, density, loss, seed):
    k = m * b
    xs = sparse_inputs(n, length, b, pattern, density, seed)
    dense = aggregate(xs, k, window)
    sparse = aggregate(xs, k, window, sparse_block=b,
                       net=NetConfig(loss=loss, duplicate=loss / 2, jitter_s=1e-3, seed=seed))
    assert dense.errors == sparse.errors == [None] * n
    for d, s in zip(dense.outputs, sparse.outputs):
        assert d.tobytes() == s.tobytes()


def test_sparse_moves_only_the_blocks_with_data():
    xs = sparse_inputs(4, 200_000, 64, "shared", 0.02, 1)
    dense = aggregate(xs, 64 * 62, 8)
    sparse = aggregate(xs, 64 * 62, 8, sparse_block=64)
    sent = {name: res.net.bytes_sent[("10.0.0.1", 7000)] for name, res in
            (("dense", dense), ("sparse", sparse))}
    assert sent["sparse"] < 0.1 * sent["dense"]


def test_negative_zero_and_threshold():
    x = np.array([0.0, -0.0, 0.0, 0.0, 1e-3, 0.0, 0.0, 0.0, 2.0, 0, 0, 0], np.float32)
    assert present_blocks(x, 4)[0].tolist() == [False, True, True]
    y = np.array([-0.0, 1e-3, 0, 0, 5.0, 0, 0, 0], np.float32)
    keep = np.array([False, True])
    zero_absent_blocks(y, keep, 4)
    assert y.tobytes() == np.array([0, 0, 0, 0, 5.0, 0, 0, 0], np.float32).tobytes()
    xs = [np.array([1e-3] * 4 + [3.0] * 4, np.float32)] * 2
    res = aggregate(xs, 8, 2, sparse_block=4, threshold=0.01)  # small blocks are dropped
    assert res.outputs[0].tolist() == [0.0] * 4 + [6.0] * 4


def test_nan_in_a_sparse_block_fails_everyone():
    xs = sparse_inputs(3, 4000, 32, "shared", 0.3, 2)
    xs[2][1000] = np.nan
    res = aggregate(xs, 32 * 4, 3, sparse_block=32)
    assert all(e and "NaN or Inf" in e for e in res.errors)


def test_payload_round_trip_and_rejects():
    part = Blocks(np.array([3, 9]), np.array([[True, False, True], [False, True, False]]),
                  np.arange(12, dtype=np.int32).reshape(3, 4))
    head = np.array([[12, -5, 7, 0], [15, 3, 1, 0]])
    data = encode(head, part)
    back, got = decode(data, 12, 4, 4)
    assert back.tolist() == [[12, 2**32 - 5, 7, 0], [15, 3, 1, 0]]
    assert got.groups.tolist() == [3, 9] and got.mask.tolist() == part.mask.tolist()
    assert got.values.tolist() == part.values.tolist()
    for broken in (data[:-4], data + b"\0\0\0\0", data[:6]):
        with pytest.raises(ValueError):
            decode(broken, 12, 4, 4)
    with pytest.raises(ValueError):
        decode(data, 13, 4, 4)  # header disagrees with the values
    with pytest.raises(ValueError, match="increasing"):  # a group twice would be added twice
        decode(encode(head, Blocks(np.array([9, 9]), part.mask, part.values)), 12, 4, 4)
    stray = bytearray(data)
    stray[12 + 4 * 4 * 2 + 4 * 2] |= 0b1000  # bit 3 of a 3-block mask
    with pytest.raises(ValueError):
        decode(bytes(stray), 12, 4, 4)
    empty_head, empty = decode(encode(np.zeros((0, 4)), Blocks.empty()), 0, 4, 4)
    assert empty_head.shape == (0, 4) and len(empty.groups) == 0


def look(rows, m):
    groups = np.array([r[0] for r in rows], dtype=np.int64)
    masks = np.array([r[2] for r in rows], dtype=bool).reshape(len(rows), m)
    return np.concatenate([groups[:, None], np.array([[r[1]] for r in rows], np.int64),
                           pack_masks(masks)], axis=1) if rows else np.zeros((0, 3), np.int64)


def test_plan_round_respects_capacity_union_and_lookahead():
    m = 4
    a = look([(0, 1, [1, 0, 0, 0]), (8, 2, [1, 1, 0, 0]), (16, 0, [1, 1, 1, 0])], m)
    b = look([(8, 5, [1, 0, 0, 0]), (24, 1, [0, 0, 0, 1])], m)
    groups, exps, union, run = plan_round([a, b], m, capacity=4, lookahead=8)
    # union blocks: group 0 -> 1, group 8 -> 2, group 16 -> 3: 0 and 8 fit in 4 blocks
    assert groups.tolist() == [0, 8] and exps.tolist() == [1, 5] and not run
    assert union.tolist() == [[True, False, False, False], [True, True, False, False]]
    groups, *_ = plan_round([a, b], m, capacity=4, lookahead=2)  # b's list is full:
    assert groups.tolist() == [0, 8]                              # nothing beyond group 24
    groups, *_ = plan_round([a, look([], m)], m, capacity=1, lookahead=8)
    assert groups.tolist() == [0]                   # at least one group, even if big
    assert plan_round([look([], m)] * 2, m, 4, 8)[0].tolist() == []


def test_plan_round_finds_dense_runs():
    m = 2
    full = [(g, g, [1, 1]) for g in (3, 6, 9)]
    groups, exps, _, run = plan_round([look(full, m), look(full, m)], m, capacity=2,
                                      lookahead=8)
    assert run and groups.tolist() == [3, 6, 9]
    partial = [(3, 0, [1, 1]), (6, 0, [1, 0])]
    assert not plan_round([look(full, m), look(partial, m)], m, 2, 8).run


def test_popcount():
    words = np.array([[0, 0], [1, 0], [0xFFFFFFFF, 3]], dtype=np.int64)
    assert popcount(words).tolist() == [0, 1, 34]


def test_negative_zeros_in_absent_blocks_come_back_as_dense_mode_gives_them():
    xs = [np.zeros(64, np.float32) for _ in range(2)]
    xs[0][3], xs[1][40], xs[1][50] = -0.0, -0.0, 7.0   # -0.0 only in absent blocks
    res = aggregate(xs, 32, 2, sparse_block=8)
    dense = aggregate([np.abs(x) for x in xs], 32, 2)
    assert res.outputs[0].tobytes() == dense.outputs[0].tobytes()


def test_present_blocks_tell_values_from_signed_zeros():
    x = np.array([0.0, 0.0, -0.0, 0.0, 0.0, 1e-45, np.nan, 0.0, -2.0, -0.0, 0.0, -0.0],
                 np.float32)
    present, negative_zero = present_blocks(x, 2)
    assert present.tolist() == [False, False, True, True, True, False]
    assert negative_zero.tolist() == [False, True, False, False, False, True]
    present, negative_zero = present_blocks(x[:11], 4)  # partial last block
    assert present.tolist() == [False, True, True]
    present, negative_zero = present_blocks(np.array([-0.0, 0.0, -0.0], np.float32), 2)
    assert present.tolist() == [False, False] and negative_zero.tolist() == [True, True]
    with pytest.raises(TypeError, match="float32"):  # it reads float32 bytes
        present_blocks(np.zeros(8), 2)


def test_peaks_of_chosen_blocks_match_those_of_all():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1003).astype(np.float32)
    every = block_peaks(x, 10)
    chosen = np.array([0, 7, 55, 100])
    assert np.array_equal(block_peaks(x, 10, chosen), every[chosen])
    assert np.array_equal(block_peaks(x, 10, np.array([3, 100])), every[[3, 100]])  # partial
    x[72] = np.nan
    assert np.isnan(block_peaks(x, 10, np.array([7]))[0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, float("nan"),
                                 -float("nan"), float("inf"), -float("inf")]),
                min_size=1, max_size=40), st.integers(1, 9))
def test_present_blocks_agree_with_the_definition(values, b):
    x = np.array(values, np.float32)
    if np.isnan(x).any():  # both NaN signs
        x[np.isnan(x)] = np.where(np.arange(np.isnan(x).sum()) % 2, -np.nan, np.nan)
    present, negative_zero = present_blocks(x, b)
    blocks = [x[i: i + b] for i in range(0, len(x), b)]
    assert present.tolist() == [bool(np.any(blk != 0) or np.isnan(blk).any()) for blk in blocks]
    assert negative_zero.tolist() == [
        not p and bool(np.signbit(blk).any()) for p, blk in zip(present, blocks)]


@pytest.mark.parametrize("zeros", [[1], [1, 5], [0, 1, 2, 3, 4, 5]])
def test_signed_zero_blocks_come_back_as_dense_mode_gives_them(zeros):
    """Blocks holding only -0.0 on every worker, at high and low density (the two ways of
    preparing), the partial last block among them: bit for bit what dense mode returns."""
    b = 4
    xs = []
    for w in range(2):
        x = np.arange(1, 23, dtype=np.float32) * (w + 1)   # 5 full blocks and a partial one
        for blk in zeros:
            x[blk * b: (blk + 1) * b] = -0.0
        xs.append(x)
    dense = aggregate(xs, 2 * b, 2)
    sparse = aggregate(xs, 2 * b, 2, sparse_block=b)
    for d, s in zip(dense.outputs, sparse.outputs):
        assert d.tobytes() == s.tobytes()
    assert not np.signbit(sparse.outputs[0][4:8]).any()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 0x80000000, 0x3F800000])),
                min_size=1, max_size=48), st.integers(1, 9))
def test_present_blocks_of_any_bit_pattern(words, b):
    """Every float32 bit pattern (NaNs whose largest byte is 0x80, values like 1.0 whose
    bytes are all at most 0x80): present and -0.0-only blocks as defined."""
    x = np.array(words, np.uint32).view(np.float32)
    present, negative_zero = present_blocks(x, b)
    blocks = [x[i: i + b] for i in range(0, len(x), b)]
    assert present.tolist() == [bool(np.any(blk != 0) or np.isnan(blk).any()) for blk in blocks]
    assert negative_zero.tolist() == [
        not p and bool(np.signbit(blk).any()) for p, blk in zip(present, blocks)]


def test_unpack_masks_round_trip_and_stray_bits():
    masks = np.array([[True, False, True], [False, False, False]])
    assert unpack_masks(pack_masks(masks), 3).tolist() == masks.tolist()
    assert unpack_masks(np.zeros((0, 1), np.int64), 3).shape == (0, 3)
    with pytest.raises(ValueError, match="beyond"):
        unpack_masks(np.array([[0b1000]]), 3)


class TestSparseDataplane:
    """The switch's sparse rounds packet by packet: an announce, the planned round, and
    contributions that do not match what their senders announced."""

    W = [("10.0.0.1", 7000), ("10.0.0.2", 7000)]
    B, M = 4, 3   # k = 12

    def setup_method(self):
        from dlcomm.switch.dataplane import Dataplane
        from dlcomm.switch.jobs import JobTable
        table = JobTable(8, 1024)
        self.dp = Dataplane(table)
        self.job = table.register(self.W, slots=1, k=self.B * self.M, block=self.B)
        self.job.live = True
        self.dp.add_job(self.job)
        from tests.switch.crew import Crew
        self.crew = Crew(self.job)

    def send(self, worker, seq, head, blocks, announce=False):
        from dlcomm.wire.packet import ANNOUNCE, DATA, SPARSE, Header
        body = encode(head, blocks)
        hdr = Header(DATA, self.job.job_id, worker, 0, blocks.values.size, seq, 0, 0,
                     flags=SPARSE | (ANNOUNCE if announce else 0))
        out = self.dp.on_datagram(self.crew.packet(hdr, body), self.W[worker])
        return [(a, h, p) for a, h, p in self.crew.read(out)]

    def announce(self, masks):
        """Both workers announce group 0 with their masks; returns the planned result."""
        for w, mask in enumerate(masks):
            out = self.send(w, 0, look([(0, 1, mask)], self.M), Blocks.empty(), announce=True)
        return out

    def test_planned_blocks_are_summed(self):
        out = self.announce([[1, 0, 0], [1, 0, 1]])
        head, _ = decode(bytes(out[0][2]), 0, self.B, 2)
        assert head.tolist() == [[0, 1]]    # group 0 planned with exponent 1
        mine = [np.array([[1, 2, 3, 4]], np.int32), np.array([[10, 20, 30, 40], [5, 5, 5, 5]],
                                                              np.int32)]
        masks = [np.array([[True, False, False]]), np.array([[True, False, True]])]
        out = []
        for w in range(2):
            out = self.send(w, 1, look([], self.M), Blocks(np.array([0]), masks[w], mine[w]))
        _, result = decode(bytes(out[0][2]), 8, self.B, 2)
        assert result.mask.tolist() == [[True, False, True]]
        assert result.values.tolist() == [[11, 22, 33, 44], [5, 5, 5, 5]]

    def test_a_block_that_was_not_announced_is_dropped(self):
        self.announce([[1, 0, 0], [1, 0, 0]])
        out = self.send(0, 1, look([], self.M),
                        Blocks(np.array([0]), np.array([[False, True, False]]),
                               np.ones((1, self.B), np.int32)))
        assert out == [] and self.dp.counters["drop_unplanned"] == 1

    def test_a_look_ahead_with_bits_beyond_the_group_is_dropped(self):
        head = look([(0, 1, [1, 0, 0])], self.M)
        head[0, 2] |= 0b1000
        assert self.send(0, 0, head, Blocks.empty(), announce=True) == []
        assert self.dp.counters["drop_length"] == 1

    def test_a_dropped_contribution_leaves_the_sums_alone(self):
        """Values with a malformed look-ahead are not added: the sender's retransmission
        is then counted once."""
        self.announce([[1, 0, 0], [1, 0, 0]])
        mine = Blocks(np.array([0]), np.array([[True, False, False]]),
                      np.full((1, self.B), 7, np.int32))
        bad = look([(3, 1, [1, 0, 0])], self.M)
        bad[0, 2] |= 0b1000
        assert self.send(0, 1, bad, mine) == []
        assert self.send(0, 1, look([], self.M), mine) == []   # the retransmission
        out = self.send(1, 1, look([], self.M), mine)
        _, result = decode(bytes(out[0][2]), 4, self.B, 2)
        assert result.values.tolist() == [[14] * self.B]
