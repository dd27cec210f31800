"""Layer tables as partition graphs: owners, folding, input and join edges."""

from __future__ import annotations

import pytest

from dlcomm.errors import ConfigError
from dlcomm.plan.partition.graph import build_graph, layer_inputs
from dlcomm.workloads.catalog.base import Layer
from tests.plan.partition.tables import linear, table, tiny_resnet


def test_tiny_resnet_edges_follow_the_data_flow():
    t = tiny_resnet()
    g = build_graph(t)
    names = g.names
    assert names == ["conv1", "block1.conv1", "block1.conv2", "block2.downsample.0",
                     "block2.conv1", "block2.conv2", "fc", "fc2"]
    edges = {(names[e.src], names[e.dst], e.kind) for e in g.edges}
    assert edges == {
        ("conv1", "block1.conv1", "input"), ("block1.conv1", "block1.conv2", "input"),
        ("conv1", "block1.conv2", "join"),                 # identity shortcut (bn2 joins bn1)
        # the projection comes first in the table; the main path reads the block input
        ("block1.conv2", "block2.downsample.0", "input"),
        ("block1.conv2", "block2.conv1", "input"),
        ("block2.conv1", "block2.conv2", "input"),
        ("block2.downsample.0", "block2.conv2", "join"),
        ("block2.conv2", "fc", "input"), ("fc", "fc2", "input")}
    inputs = layer_inputs(t)
    by_name = {x.name: i for i, x in enumerate(t.layers)}
    assert inputs[by_name["block2.conv1"]] == inputs[by_name["block2.downsample.0"]]
    # batch norm and pooling follow their producer
    assert g.nodes[0].owns == ("bn1",)
    assert g.nodes[5].owns == ("block2.bn2", "pool")
    assert g.nodes[0].takes_input and not any(n.takes_input for n in g.nodes[1:])
    assert g.nodes[0].fold_params == 12          # bn1: scale and shift of 6 channels


def test_leading_parameters_need_an_input_gradient():
    emb = Layer("emb", "embedding", 100, 0.0, 1, 4, 25, 4)
    g = build_graph(table("t", [emb, linear("fc", 4, 200)]))
    assert not g.nodes[0].takes_input and g.nodes[0].owns == ("emb",)
    assert g.nodes[0].fold_params == 100


def test_no_partitioned_layer_is_an_error():
    norm = Layer("ln", "norm", 8, 20.0, 4, 4, 4, 4)
    with pytest.raises(ConfigError, match="no conv or linear"):
        build_graph(table("t", [norm]))


def test_a_layer_without_a_tensor_of_its_size_reads_a_part_of_the_previous():
    emb = Layer("emb", "embedding", 4, 0.0, 1, 4, 1, 4)
    t = table("t", [linear("a", 4, 6), linear("pool", 3, 2), emb])
    assert layer_inputs(t) == [-1, 0, -1]          # a slice of a's output; lookups: input
    g = build_graph(t)
    assert [(e.src, e.dst, e.elems) for e in g.edges] == [(0, 1, 3)]


def test_catalog_resnet50_has_a_join_per_block():
    from dlcomm.workloads.catalog import get_model
    g = build_graph(get_model("resnet50"))
    assert len(g) == 54                                   # 53 conv + fc
    assert sum(e.kind == "join" for e in g.edges) == 16   # 3 + 4 + 6 + 3 blocks
    for e in g.edges:                                     # every input edge carries the
        if e.kind == "input":                             # consumer's input, which its
            src = g.nodes[e.src]                          # producer (pooled) made
            assert e.elems == g.nodes[e.dst].in_elems
            assert e.elems <= src.out_elems


def test_tables_mostly_outside_conv_and_linear_are_refused():
    emb = Layer("emb", "embedding", 10_000, 0.0, 1, 4, 2_500, 4)
    with pytest.raises(ConfigError, match="100% of its parameters are in embedding layers"):
        build_graph(table("t", [emb, linear("fc", 4, 2)]))
