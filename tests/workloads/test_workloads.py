import math

import pytest
import torch

from dlcomm.errors import ConfigError, RegistryError
from dlcomm.workloads import WORKLOADS, finish_metrics, make_workload
from dlcomm.workloads.stdlib_lm import build_corpus, corpus_files, is_heldout, stdlib_root, tokenize

SMALL_LM = "stdlib-lm:vocab=10000,tokens=400K,test_tokens=8K,dim=32,layers=1"


def test_catalog_names():
    assert {"digits-cnn", "stdlib-lm", "synthetic"} <= set(WORKLOADS)
    with pytest.raises(RegistryError):
        make_workload("imagenet")


def test_digits_split_and_model():
    w = make_workload("digits-cnn")
    assert (len(w.train_set), len(w.test_set)) == (1437, 360)
    x, y = w.train_set[:5]
    assert w.model(x).shape == (5, 10) and y.dtype == torch.long
    assert w.metric == "accuracy" and w.gradient_bytes == 4 * w.num_parameters


def test_same_seed_same_model():
    a, b = make_workload("digits-cnn", seed=3), make_workload("digits-cnn", seed=3)
    c = make_workload("digits-cnn", seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert not torch.equal(next(a.model.parameters()), next(c.model.parameters()))


def test_synthetic_sizes_and_dense_gradient():
    w = make_workload("synthetic:tensors=3,numel=1K")
    assert w.num_parameters == 3000
    x, y = w.train_set[:4]
    w.loss(w.model(x), y).backward()
    assert all((p.grad != 0).all() for p in w.model.parameters())
    with pytest.raises(ConfigError, match="no option"):
        make_workload("synthetic:size=3")
    with pytest.raises(ConfigError, match="bad value"):
        make_workload("synthetic:numel=lots")


def test_tokenize():
    assert tokenize("def f(x): return x+1  # hi") == [
        "def", "f", "(", "x", ")", ":", "return", "x", "+", "1", "#", "hi"]


def test_stdlib_corpus_split_by_file_and_vocab():
    files = corpus_files(stdlib_root())
    rels = [f.relative_to(stdlib_root()).as_posix() for f in files]
    assert len(files) > 200 and not any("/test/" in f"/{r}" for r in rels)
    assert any(is_heldout(r) for r in rels) and not all(is_heldout(r) for r in rels)
    corpus = build_corpus(10_000, 400_000, 20_000)
    assert len(corpus.vocab) == 10_000 and corpus.vocab[0] == "<unk>"
    assert len(corpus.train) == 400_000 and len(corpus.test) == 20_000
    assert int(corpus.train.max()) < 10_000


def test_lm_embedding_gradient_is_sparse():
    w = make_workload(SMALL_LM)
    x, y = w.train_set[:8]
    w.loss(w.model(x), y).backward()
    rows = (w.model.tok.weight.grad.abs().sum(dim=1) > 0).float().mean().item()
    assert 0 < rows < 0.05  # a batch touches a few hundred of >= 12,000 rows
    assert w.facts["vocab"] >= 10_000


def test_lm_rejects_small_vocab():
    with pytest.raises(ConfigError, match="vocab must be >= 10000"):
        make_workload("stdlib-lm:vocab=500")


def test_finish_metrics():
    sums = torch.tensor([2 * math.log(4.0), 1.0, 2.0], dtype=torch.float64)
    m = finish_metrics("perplexity", sums)
    assert m["perplexity"] == pytest.approx(4.0) and m["accuracy"] == 0.5
    assert finish_metrics("accuracy", sums)["accuracy"] == 0.5
