"""Compute-time model and DDP-style gradient buckets."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.errors import ConfigError
from dlcomm.workloads.accelerators import get_accelerator
from dlcomm.workloads.catalog import (
    BACKWARD_FACTOR,
    get_model,
    gradient_buckets,
    iteration_time,
    model_buckets,
)
from dlcomm.workloads.catalog.compute import DDP_BUCKET_CAP_BYTES


def test_iteration_time_closed_form():
    model, v100 = get_model("resnet50"), get_accelerator("v100")
    timing = iteration_time(model, v100, 256)
    expected = model.flops_per_sample * 256 / (125e12 * 0.4)
    assert timing.forward_s == pytest.approx(expected, rel=1e-12)
    assert timing.backward_s == pytest.approx(2 * expected, rel=1e-12)
    assert timing.iteration_s == pytest.approx(3 * expected, rel=1e-12)
    assert [n for n, _ in timing.backward] == [layer.name for layer in reversed(model.layers)]
    assert [n for n, _ in timing.forward] == [layer.name for layer in model.layers]
    conv1 = dict(timing.forward)["conv1"]
    assert conv1 == pytest.approx(2 * 118013952 * 256 / 50e12, rel=1e-12)
    assert dict(timing.backward)["conv1"] == pytest.approx(BACKWARD_FACTOR * conv1)
    assert (timing.batch, timing.efficiency, timing.scale) == (256, 0.4, 1.0)


def test_efficiency_and_accelerator_default():
    model = get_model("bert-base")
    half = iteration_time(model, get_accelerator("a100"), 8, efficiency=0.8)
    default = iteration_time(model, get_accelerator("a100"), 8)
    assert default.iteration_s == pytest.approx(2 * half.iteration_s)
    assert iteration_time(model, get_accelerator("a100", 0.8), 8).iteration_s == \
        pytest.approx(half.iteration_s)


def test_measured_time_rescales_keeping_shares():
    model, acc = get_model("vgg16"), get_accelerator("h100")
    estimate = iteration_time(model, acc, 32)
    measured = iteration_time(model, acc, 32, measured_s=0.25)
    assert measured.iteration_s == pytest.approx(0.25, rel=1e-12)
    assert measured.scale == pytest.approx(0.25 / estimate.iteration_s)
    for (_, a), (_, b) in zip(estimate.backward, measured.backward):
        assert b == pytest.approx(a * measured.scale, rel=1e-12)


@pytest.mark.parametrize("kwargs", [dict(batch=0), dict(batch=4, efficiency=0.0),
                                    dict(batch=4, efficiency=1.5),
                                    dict(batch=4, measured_s=-1.0)])
def test_bad_timing_inputs(kwargs):
    with pytest.raises(ConfigError):
        iteration_time(get_model("alexnet"), get_accelerator("v100"), **kwargs)


def test_resnet50_buckets():
    model = get_model("resnet50")
    timing = iteration_time(model, get_accelerator("v100"), 64)
    buckets = model_buckets(model, timing)
    assert sum(b.bytes for b in buckets) == model.gradient_bytes()
    assert buckets[0].layers[0] == "fc"                 # the last layer's gradient comes first
    assert all(b.bytes <= DDP_BUCKET_CAP_BYTES for b in buckets)
    assert [b.ready_s for b in buckets] == sorted(b.ready_s for b in buckets)
    assert buckets[-1].ready_s <= timing.backward_s
    first_layer = dict(timing.backward)["conv1"]
    assert buckets[-1].ready_s == pytest.approx(timing.backward_s)   # conv1 ends backward
    assert first_layer > 0
    small = model_buckets(model, timing, first_cap_bytes=2**20)   # DDP's first bucket
    assert small[0].layers == ("fc",) and len(buckets[0].layers) > 1   # fc alone is 8 MB


def test_gpt3_layers_larger_than_the_cap_get_their_own_bucket():
    model = get_model("gpt3-175b")
    buckets = model_buckets(model, iteration_time(model, get_accelerator("h100"), 1))
    over = [b for b in buckets if b.bytes > DDP_BUCKET_CAP_BYTES]
    assert over and all(len(b.layers) == 1 for b in over)
    assert sum(b.params for b in buckets) == model.params


layers_strategy = st.lists(
    st.tuples(st.integers(0, 3000), st.floats(0, 1e-2, allow_nan=False)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(layers=layers_strategy, cap=st.integers(1, 8000),
       first=st.one_of(st.none(), st.integers(1, 8000)), bpp=st.sampled_from([2, 4]))
def test_bucket_properties(layers, cap, first, bpp):
    names = [f"l{i}" for i in range(len(layers))]
    params = [n for n, _ in layers]
    times = [t for _, t in layers]
    buckets = gradient_buckets(names, params, times, cap, first, bpp)
    # every layer with parameters exactly once, in backward (input) order
    flat = list(itertools.chain.from_iterable(b.layers for b in buckets))
    assert flat == [n for n, p in zip(names, params) if p > 0]
    assert sum(b.params for b in buckets) == sum(params)
    clock = list(itertools.accumulate(times))
    for i, b in enumerate(buckets):
        assert b.index == i and b.layers and b.bytes == b.params * bpp
        assert b.params == sum(params[names.index(n)] for n in b.layers)
        limit = first if (i == 0 and first is not None) else cap
        assert b.bytes <= limit or len(b.layers) == 1            # caps respected
        assert b.ready_s == clock[names.index(b.layers[-1])]     # ready with its last layer
    # greedy: the next bucket's first layer would not have fitted
    for i, (b, nxt) in enumerate(zip(buckets, buckets[1:])):
        limit = first if (i == 0 and first is not None) else cap
        assert b.bytes + params[names.index(nxt.layers[0])] * bpp > limit
    assert [b.ready_s for b in buckets] == sorted(b.ready_s for b in buckets)


def test_bucket_input_errors():
    with pytest.raises(ValueError):
        gradient_buckets(["a"], [1, 2], [0.1])
    with pytest.raises(ConfigError):
        gradient_buckets(["a"], [1], [0.1], cap_bytes=0)
    assert gradient_buckets([], [], []) == ()
