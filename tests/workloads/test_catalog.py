"""Layer tables of the big-model catalog, checked against published counts, torch's own
modules and torch's FLOP counter."""

import math
import time

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from dlcomm.errors import RegistryError
from dlcomm.workloads.catalog import MODELS, Layer, ModelTable, get_model
from dlcomm.workloads.catalog.cnn import IMAGE, RESNET_CONFIGS, AlexNet, ResNet
from dlcomm.workloads.catalog.recommender import CRITEO_KAGGLE_ROWS
from dlcomm.workloads.catalog.report import group_repeated_blocks
from dlcomm.workloads.catalog.rnn import LSTM_ELEMENTWISE
from dlcomm.workloads.catalog.transformer import TransformerConfig, block_layers

NAMES = {"alexnet", "vgg16", "vgg19", "resnet18", "resnet34", "resnet50", "resnet101",
         "resnet152", "bert-base", "bert-large", "gpt2-1.5b", "gpt3-175b", "dlrm", "ncf",
         "lstm-lm"}

# torchvision's published parameter counts (ImageNet-1K weights tables), exact.
TORCHVISION_PARAMS = {"alexnet": 61_100_840, "vgg16": 138_357_544, "vgg19": 143_667_240,
                      "resnet18": 11_689_512, "resnet34": 21_797_672,
                      "resnet50": 25_557_032, "resnet101": 44_549_160,
                      "resnet152": 60_192_808}
# multiply-adds of the conv and linear layers per 224x224 image, as torchvision publishes
# them ("GFLOPS" column, which counts multiply-adds)
TORCHVISION_GMACS = {"alexnet": 0.71, "vgg16": 15.47, "vgg19": 19.63, "resnet18": 1.81,
                     "resnet34": 3.66, "resnet50": 4.09, "resnet101": 7.80,
                     "resnet152": 11.51}


def matmul_flops(model: ModelTable) -> float:
    return sum(layer.flops for layer in model.layers if layer.kind in ("conv", "linear"))


def test_catalog_names_and_cache():
    assert set(MODELS.names()) == NAMES
    assert get_model("resnet50") is get_model("resnet50")
    with pytest.raises(RegistryError, match="unknown model 'resnet51'.*resnet50"):
        get_model("resnet51")


@pytest.mark.parametrize("name", sorted(NAMES))
def test_params_within_two_percent_of_published(name):
    model = get_model(name)
    assert abs(model.params / model.published_params - 1) <= 0.02, (model.params,
                                                                    model.published_params)
    assert model.source and model.sample and model.default_batch >= 1
    assert all(layer.params >= 0 and layer.flops >= 0 for layer in model.layers)
    assert all(layer.in_elems > 0 and layer.out_elems > 0 for layer in model.layers)


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_cnns_match_torchvision(name):
    model = get_model(name)
    assert model.params == TORCHVISION_PARAMS[name]
    assert matmul_flops(model) / 2 / 1e9 == pytest.approx(TORCHVISION_GMACS[name], rel=0.01)


def test_resnet50_conv1_and_fc_by_hand():
    model = get_model("resnet50")
    conv1 = model.layer("conv1")
    assert (conv1.kind, conv1.params, conv1.flops) == ("conv", 9408, 2 * 118013952)
    assert (conv1.c_in, conv1.c_out, conv1.kernel) == (3, 64, 7)
    assert (conv1.area_in, conv1.area_out) == (224 * 224, 112 * 112)
    assert (conv1.in_elems, conv1.out_elems) == (3 * 224 * 224, 64 * 112 * 112)
    fc = model.layer("fc")
    assert (fc.params, fc.flops, fc.c_in, fc.c_out, fc.area_in, fc.area_out) == (
        2048 * 1000 + 1000, 2 * 2048 * 1000, 2048, 1000, 1, 1)
    # ~4.1 GMACs = ~8.2 GFLOPs forward per image, element-wise layers included
    assert model.flops_per_sample == pytest.approx(8.2e9, rel=0.02)
    assert matmul_flops(get_model("vgg16")) == pytest.approx(2 * 15.5e9, rel=0.01)


def counted_flops(build) -> int:
    with torch.device("meta"):
        module = build()
    with FlopCounterMode(display=False) as counter:
        module(torch.empty((1, *IMAGE), device="meta"))
    return counter.get_total_flops()


def test_cnn_flops_equal_torch_flop_counter():
    # ResNet: every conv is followed by a batch norm, so conv rows hold the conv alone
    assert matmul_flops(get_model("resnet18")) == counted_flops(lambda: ResNet(18))
    # AlexNet: each conv and the first two linears carry their folded ReLU (1 per output
    # element); classifier.1 also carries the dropout in front of classifier.4
    model = get_model("alexnet")
    folded = sum(layer.out_elems for layer in model.layers if layer.kind == "conv")
    folded += 3 * 4096
    assert matmul_flops(model) - folded == counted_flops(AlexNet)


def test_vgg_is_a_chain():
    model = get_model("vgg16")
    for before, after in zip(model.layers, model.layers[1:]):
        assert after.in_elems == before.out_elems, (before.name, after.name)
    assert [layer.kind for layer in model.layers].count("conv") == 13
    assert [layer.kind for layer in model.layers].count("linear") == 3


@pytest.mark.parametrize("depth", sorted(RESNET_CONFIGS))
def test_resnet_residual_joins(depth):
    model = get_model(f"resnet{depth}")
    names = [layer.name for layer in model.layers]
    joins = [layer for layer in model.layers if layer.shortcut_from]
    assert len(joins) == sum(RESNET_CONFIGS[depth][1])       # one per residual block
    last_bn = "bn2" if depth < 50 else "bn3"
    previous_output = "maxpool"
    for join in joins:
        block = join.name.rsplit(".", 1)[0]                    # "layer2.0"
        assert join.name == f"{block}.{last_bn}"
        assert names.index(join.shortcut_from) < names.index(join.name)
        projection = f"{block}.downsample.1"
        expected = projection if projection in names else previous_output
        assert join.shortcut_from == expected
        source = model.layer(join.shortcut_from)
        assert source.out_elems == join.out_elems              # shapes agree at the add
        previous_output = join.name


def test_bert_attention_block_by_hand():
    model = get_model("bert-base")
    s, d = 512, 768
    qkv = model.layer("encoder.0.attention.qkv")
    assert (qkv.params, qkv.flops) == (d * 3 * d + 3 * d, 2 * s * d * 3 * d)
    core = model.layer("encoder.0.attention.core")
    assert (core.kind, core.params, core.flops) == ("attention", 0, 2 * 2 * s * s * d)
    assert (core.area_in, core.area_out, core.out_elems) == (s, s, s * d)
    proj = model.layer("encoder.0.attention.proj")
    assert proj.params == d * d + d and proj.shortcut_from == "embeddings.norm"
    assert model.layer("encoder.1.attention.proj").shortcut_from == "encoder.0.ffn.norm"
    assert model.layer("encoder.3.ffn.proj").shortcut_from == "encoder.3.attention.norm"
    assert model.layer("pooler").params == d * d + d
    assert model.params == 109_482_240                       # the released bert-base
    assert get_model("bert-large").params == 335_141_888


def test_transformer_block_matches_torch_encoder_layer():
    s, d, heads, f = 16, 64, 4, 256
    cfg = TransformerConfig("gpt", 100, s, d, 1, heads, f, s)
    block = block_layers(cfg, "h.0", "wpe")
    with torch.device("meta"):
        reference = nn.TransformerEncoderLayer(d, heads, f, batch_first=True)
    assert sum(layer.params for layer in block) == sum(
        p.numel() for p in reference.parameters()) == 12 * d * d + 13 * d
    with FlopCounterMode(display=False) as counter:
        reference(torch.empty(1, s, d, device="meta"))
    folded = 2 * s * d + s * f       # residual adds and GELU folded into the projections
    table = sum(layer.flops for layer in block if layer.kind in ("linear", "attention"))
    assert table - folded == counter.get_total_flops()


def test_gpt_models():
    gpt2 = get_model("gpt2-1.5b")
    assert gpt2.params == 1_557_611_200                      # the released checkpoint
    head = gpt2.layer("lm_head")
    assert head.params == 0 and head.flops == 2 * 1024 * 1600 * 50257
    assert gpt2.sparse_layers() == ()                        # wte is tied, wpe read in full
    start = time.perf_counter()
    gpt3 = MODELS.get("gpt3-175b").__wrapped__()             # uncached build
    assert time.perf_counter() - start < 3.0
    assert len(gpt3.layers) == 2 + 96 * 7 + 2
    tokens, d, blocks = 2048, 12288, 96
    attention = blocks * 4 * tokens * d                      # per token: 4 s d per block
    per_token = gpt3.flops_per_sample / tokens
    assert per_token == pytest.approx(2 * 175e9 + attention, rel=0.03)


def test_dlrm_table():
    model = get_model("dlrm")
    tables = [layer for layer in model.layers if layer.kind == "embedding"]
    assert [t.c_in for t in tables] == list(CRITEO_KAGGLE_ROWS) and len(tables) == 26
    assert all(t.c_out == 16 and t.in_elems == 1 and t.flops == 0 for t in tables)
    assert model.sparse_layers() == tuple(tables)
    bottom = 13 * 512 + 512 + 512 * 256 + 256 + 256 * 64 + 64 + 64 * 16 + 16
    top = 367 * 512 + 512 + 512 * 256 + 256 + 256 + 1
    assert model.params == sum(CRITEO_KAGGLE_ROWS) * 16 + bottom + top
    interaction = model.layer("interaction")
    assert interaction.out_elems == 27 * 26 // 2 + 16 == model.layer("top_mlp.0").c_in
    assert interaction.shortcut_from == "bot_mlp.3"


def test_ncf_and_lstm_match_torch_modules():
    with torch.device("meta"):
        ncf = [nn.Embedding(138493, 64), nn.Embedding(26744, 64), nn.Embedding(138493, 128),
               nn.Embedding(26744, 128), nn.Linear(256, 256), nn.Linear(256, 128),
               nn.Linear(128, 64), nn.Linear(128, 1)]
        lstm = nn.LSTM(1500, 1500)
        lm = [nn.Embedding(10000, 1500), lstm, nn.LSTM(1500, 1500), nn.Linear(1500, 10000)]
    count = lambda modules: sum(p.numel() for m in modules for p in m.parameters())  # noqa: E731
    assert get_model("ncf").params == count(ncf) == 31_832_577
    assert len(get_model("ncf").sparse_layers()) == 4
    model = get_model("lstm-lm")
    assert model.params == count(lm)
    with FlopCounterMode(display=False) as counter:
        lstm(torch.empty(35, 1, 1500, device="meta"))
    layer = model.layer("lstm.0")
    assert layer.flops - 35 * LSTM_ELEMENTWISE * 1500 == counter.get_total_flops()
    assert [t.name for t in model.sparse_layers()] == ["embedding"]


def test_table_validation():
    a = Layer("a", "linear", 1, 1.0, 1, 1)
    with pytest.raises(ValueError, match="listed twice"):
        ModelTable("m", "cnn", (a, a), "x", 1, "s", 1)
    with pytest.raises(ValueError, match="not an earlier layer"):
        ModelTable("m", "cnn", (Layer("b", "linear", 1, 1.0, 1, 1, shortcut_from="a"), a),
                   "x", 1, "s", 1)
    with pytest.raises(ValueError, match="unknown kind"):
        ModelTable("m", "cnn", (Layer("c", "dense", 1, 1.0, 1, 1),), "x", 1, "s", 1)
    with pytest.raises(KeyError):
        get_model("alexnet").layer("nope")


@pytest.mark.parametrize("name", ["gpt3-175b", "resnet50", "alexnet", "dlrm", "bert-large"])
def test_grouped_blocks_cover_every_layer(name):
    model = get_model(name)
    groups = group_repeated_blocks(model.layers)
    assert sum(g.count * len(g.layers) for g in groups) == len(model.layers)
    flat = []
    for g in groups:
        flat += [layer.name for layer in g.layers]
        if g.count > 1:
            assert all(g.row_name(layer).startswith(g.label) for layer in g.layers)
    names = [layer.name for layer in model.layers]
    assert all(n in names for n in flat)
    flops = sum(g.count * sum(layer.flops for layer in g.layers) for g in groups)
    assert math.isclose(flops, model.flops_per_sample, rel_tol=1e-12)


def test_grouping_labels():
    labels = [(g.label, g.count) for g in group_repeated_blocks(get_model("resnet50").layers)]
    assert ("layer1.[1-2]", 2) in labels and ("layer3.[1-5]", 5) in labels
    assert ("layer1.0", 1) in labels
    gpt3 = group_repeated_blocks(get_model("gpt3-175b").layers)
    assert [(g.label, g.count) for g in gpt3 if g.count > 1] == [("h.[0-95]", 96)]
    assert len(group_repeated_blocks(get_model("alexnet").layers)) == 12
