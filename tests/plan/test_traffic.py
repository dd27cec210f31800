"""Per-iteration traffic from hand-built layer tables, then from the real catalog."""

import pytest

from dlcomm.errors import ConfigError
from dlcomm.plan.traffic import Parallelism, iteration_traffic, parse_parallelism, stages
from dlcomm.workloads.catalog.base import Layer, ModelTable


def lin(name, d_in, d_out, tokens):
    return Layer(name, "linear", d_in * d_out, 2.0 * tokens * d_in * d_out, tokens * d_in,
                 tokens * d_out, d_in, d_out, 1, tokens, tokens)


def toy_transformer(blocks=4, d=8, tokens=10):
    """embedding, then blocks of (norm, qkv, proj, mlp.fc, mlp.proj), width d."""
    layers = [Layer("emb", "embedding", 100 * d, 0.0, tokens, tokens * d, 100, d, 1,
                    tokens, tokens)]
    for b in range(blocks):
        layers += [Layer(f"h.{b}.ln", "norm", 2 * d, 1.0, tokens * d, tokens * d, d, d),
                   lin(f"h.{b}.attn.qkv", d, 3 * d, tokens),
                   Layer(f"h.{b}.attn.core", "attention", 0, 1.0, 3 * tokens * d,
                         tokens * d, 3 * d, d, 1, tokens, tokens),
                   lin(f"h.{b}.attn.proj", d, d, tokens),
                   lin(f"h.{b}.mlp.fc", d, 4 * d, tokens),
                   lin(f"h.{b}.mlp.proj", 4 * d, d, tokens)]
    return ModelTable("toy", "transformer", tuple(layers), f"{tokens} tokens", 0, "test", 2)


def by_dim(comms):
    return {c.dim: c for c in comms}


def test_data_parallel_only():
    m = toy_transformer()
    comms = by_dim(iteration_traffic(m, Parallelism(dp=8)))
    assert list(comms) == ["dp"]
    dp = comms["dp"]
    assert (dp.op, dp.group, dp.calls) == ("allreduce", 8, 1)
    assert dp.nbytes == m.params * 2                   # bf16 gradients


def test_tensor_parallel_pairs_and_sizes():
    m, d, tokens = toy_transformer(blocks=4), 8, 10
    par = Parallelism(dp=2, tp=4, batch=6)
    comms = by_dim(iteration_traffic(m, par))
    tp = comms["tp"]
    # 2 pairs per block, each 1 all-reduce forward + 1 backward, plus the embedding
    assert tp.calls == 4 * 2 * 2 + 1
    assert tp.nbytes == pytest.approx(6 * tokens * d * 2)          # b * s * h * bytes
    # each rank holds 1/4 of the linear and embedding weights, all of the norms
    split = sum(l.params for l in m.layers if l.kind in ("linear", "embedding"))
    assert comms["dp"].nbytes == pytest.approx((split / 4 + 4 * 2 * d) * 2)


def test_pipeline_stages_and_p2p():
    m = toy_transformer(blocks=4)
    parts = stages(m, 4)
    assert len(parts) == 4 and sum(map(len, parts)) == len(m.layers)
    comms = by_dim(iteration_traffic(m, Parallelism(dp=2, pp=4, micro=8, batch=16)))
    pp = comms["pp"]
    # 8 micro-batches of 2 samples: 8 forward + 8 backward messages of b s h
    assert (pp.op, pp.group, pp.calls) == ("p2p", 4, 16)
    assert pp.nbytes == pytest.approx(2 * 10 * 8 * 2)
    with pytest.raises(ConfigError, match="exceeds"):
        stages(m, 100)


def test_mixture_of_experts():
    m, tokens, d = toy_transformer(blocks=4), 10, 8
    comms = by_dim(iteration_traffic(m, Parallelism(dp=8, ep=4, batch=4)))
    # every 2nd MLP (blocks 1 and 3) is an MoE layer: 4 all-to-alls each
    ep = comms["ep"]
    assert (ep.op, ep.group, ep.calls) == ("alltoall", 4, 8)
    assert ep.nbytes == pytest.approx(4 * tokens * d * 2)
    experts = 2 * (d * 4 * d + 4 * d * d)
    assert comms["dp-expert"].group == 2
    assert comms["dp-expert"].nbytes == pytest.approx(experts * 2)
    assert comms["dp"].nbytes == pytest.approx((m.params - experts) * 2)


def test_recommender_embeddings_all_to_all():
    emb = [Layer(f"emb.{i}", "embedding", 1000 * 16, 0.0, 1, 16, 1000, 16) for i in range(3)]
    mlp = [Layer("top", "linear", 48 * 1, 96.0, 48, 1, 48, 1)]
    m = ModelTable("rec", "recommender", tuple(emb + mlp), "record", 0, "test", 32)
    comms = by_dim(iteration_traffic(m, Parallelism(dp=4)))
    assert comms["embedding"].nbytes == 32 * 48 * 2 and comms["embedding"].calls == 2
    assert comms["dp"].nbytes == 48 * 2
    with pytest.raises(ConfigError, match="recommender"):
        iteration_traffic(m, Parallelism(dp=2, tp=2))


def test_parse_parallelism():
    assert parse_parallelism("64x4x4") == Parallelism(64, 4, 4)
    assert parse_parallelism("dp=8,ep=4,micro=4") == Parallelism(dp=8, ep=4, micro=4)
    for bad, match in (("dp=8,zz=1", "unknown"), ("dp=x", "integer"), ("8x", "bad"),
                       ("dp=6,ep=4", "divide"), ("dp=0", ">= 1")):
        with pytest.raises(ConfigError, match=match):
            parse_parallelism(bad)


def test_catalog_models_end_to_end():
    from dlcomm.workloads.catalog import get_model

    gpt3 = get_model("gpt3-175b")
    comms = by_dim(iteration_traffic(gpt3, parse_parallelism("dp=16,pp=8,tp=8")))
    # Megatron: one TP all-reduce is b s h = 1 x 2048 x 12288 in bf16
    assert comms["tp"].nbytes == pytest.approx(2048 * 12288 * 2)
    # DP all-reduces about 1/64 of 175B parameters per rank
    assert comms["dp"].nbytes == pytest.approx(gpt3.params / 64 * 2, rel=0.1)
    resnet = get_model("resnet50")
    (dp,) = iteration_traffic(resnet, Parallelism(dp=1024))
    assert dp.nbytes == resnet.params * 2
    dlrm = by_dim(iteration_traffic(get_model("dlrm"), Parallelism(dp=64)))
    assert dlrm["embedding"].nbytes == 128 * 26 * 16 * 2
