"""The large word-level LSTM language model of Zaremba, Sutskever & Vinyals (2014).

Penn Treebank, vocabulary 10,000, two LSTM layers of 1500 units, 1500-wide embeddings,
unrolled for 35 steps (one sample = one sequence of 35 tokens), dropout 65% on the
non-recurrent connections (no FLOPs counted). Parameters follow ``torch.nn.LSTM``, which
keeps two bias vectors per layer (the paper's TensorFlow code keeps one: 12,000 fewer).

FLOPs per token of an LSTM layer with input width ``i`` and ``h`` units:
``2 * 4h (i + h)`` for the four gate products, plus ``LSTM_ELEMENTWISE * h`` for the
element-wise work counted at 1 FLOP per element touched: two bias additions (8h), three
sigmoids and two tanh (5h), the cell update ``f*c + i*g`` (3h) and ``o * tanh(c)`` (1h).
"""

from __future__ import annotations

from dlcomm.workloads.catalog.base import Layer, ModelTable, register_model

__all__ = ["lstm_layer", "lstm_lm_layers", "LSTM_ELEMENTWISE"]

LSTM_ELEMENTWISE = 17


def lstm_layer(name: str, d_in: int, hidden: int, steps: int) -> Layer:
    """One unidirectional LSTM layer over ``steps`` tokens."""
    params = 4 * hidden * (d_in + hidden) + 2 * 4 * hidden
    flops = steps * (2.0 * 4 * hidden * (d_in + hidden) + LSTM_ELEMENTWISE * hidden)
    return Layer(name, "lstm", params, flops, steps * d_in, steps * hidden, d_in, hidden, 1,
                 steps, steps)


def lstm_lm_layers(vocab: int = 10000, hidden: int = 1500, layers: int = 2,
                   steps: int = 35) -> tuple[Layer, ...]:
    """Embedding -> ``layers`` LSTM layers -> linear decoder over the vocabulary."""
    out = [Layer("embedding", "embedding", vocab * hidden, 0.0, steps, steps * hidden, vocab,
                 hidden, 1, steps, steps)]
    out += [lstm_layer(f"lstm.{i}", hidden, hidden, steps) for i in range(layers)]
    out.append(Layer("decoder", "linear", hidden * vocab + vocab, 2.0 * steps * hidden * vocab,
                     steps * hidden, steps * vocab, hidden, vocab, 1, steps, steps))
    return tuple(out)


@register_model("lstm-lm", "2-layer LSTM language model, 1500 units (Zaremba et al., 66M)")
def lstm_lm() -> ModelTable:
    return ModelTable(
        "lstm-lm", "rnn", lstm_lm_layers(), "sequence of 35 tokens", 66e6,
        "Zaremba et al. 2014, 'Recurrent Neural Network Regularization' (large LSTM); "
        "66M as tabulated by Merity et al., ICLR 2018 (AWD-LSTM), Table 1", 20)
