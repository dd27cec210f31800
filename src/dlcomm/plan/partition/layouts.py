"""The three partition types of a layer, the layouts they need and make, and what moves.

AccPar (HPCA'20; docs/references.md) sees layer l as a matrix product
``F_l (B x C_in) . W_l (C_in x C_out) = F_{l+1} (B x C_out)``; backward computes
``E_l = E_{l+1} . W_l^T`` and ``dW_l = F_l^T . E_{l+1}``. A convolution multiplies the
activations by the feature-map area and the weights by K^2. Splitting the product between
sides (two in AccPar's binary hierarchy, p in general) along one of its three dimensions:

====  ==============  ======================  =====================  =========================
type  splits          F_l needed as (input)   F_{l+1} made as        intra-layer communication
====  ==============  ======================  =====================  =========================
I     batch B         ROWS (own samples)      ROWS                   dW_l partial sums (|W_l|)
II    C_in            COLS (own features)     FULL after reduction   F_{l+1} partial sums
III   C_out           FULL                    COLS                   E_l partial sums
====  ==============  ======================  =====================  =========================

Errors flow the other way in the same layouts: a layer makes E_l in the layout it needs
F_l in, and needs E_{l+1} in the layout it makes F_{l+1} in (type III reduces its partial
E_l to FULL; type II needs the whole E_{l+1}). A *transition* between a producer and a
consumer therefore converts F from ``OUT[t_prev]`` to ``IN[t]`` and E from ``IN[t]`` back
to ``OUT[t_prev]``; with two equal sides this gives exactly AccPar's table
(docs/references.md): I->I, II->III, III->II: 0; I->II, III->I: 0.25(|F|+|E|); I->III,
III->III: 0.5|F|; II->I, II->II: 0.5|E| (a test derives it). A residual *join* adds a
source's output to the joining layer's output, so it converts ``OUT[t_src]`` <->
``OUT[t_join]`` both ways.

A layout's shares are fractions per side, in rank order: side k holds the interval
``[sum(shares[:k]), sum(shares[:k+1]))`` of the split dimension. Everything here is a pure
function on numpy arrays of shares with shape ``(..., p)``, vectorised over the leading axes.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

__all__ = ["PartType", "Layout", "IN_LAYOUT", "OUT_LAYOUT", "TYPES", "convert",
           "transition", "join_transition", "equal_table", "integer_split"]


class PartType(IntEnum):
    """How one layer's matrix product is split between the sides of a node."""

    I = 0     # noqa: E741  (the paper's name) batch split, weights replicated
    II = 1    # input features/channels split, partial sums of the output
    III = 2   # output features/channels split, partial sums of the input error

    @property
    def label(self) -> str:
        return self.name


TYPES = (PartType.I, PartType.II, PartType.III)


class Layout(IntEnum):
    """How a (B x C) activation or error tensor is laid out over the sides."""

    ROWS = 0  # split along the batch (samples)
    COLS = 1  # split along features / channels
    FULL = 2  # every side holds the whole tensor


IN_LAYOUT = (Layout.ROWS, Layout.COLS, Layout.FULL)    # F_l needed, E_l made, per type
OUT_LAYOUT = (Layout.ROWS, Layout.FULL, Layout.COLS)   # F_{l+1} made, E_{l+1} needed


def _bounds(shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    end = np.cumsum(shares, axis=-1)
    return end - shares, end


def convert(src: Layout, src_shares: np.ndarray, dst: Layout,
            dst_shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fractions of a tensor each side receives and sends to go from ``src`` to ``dst``.

    Steps: side k needs region ``N_k`` (its interval of the dst dimension, or everything
    for FULL) and owns region ``O_k`` (likewise for src); it receives ``|N_k \\ O_k|``, each
    element from the one side that owns it (a split src layout is a partition; a FULL src
    needs nothing). Regions are rectangles, so:

    - dst FULL from a split src: receive ``1 - s_k``, send ``(p-1) s_k``;
    - split dims differ (ROWS <-> COLS): receive ``d_k (1 - s_k)``, send ``s_k (1 - d_k)``;
    - same split dim: receive ``d_k - |I_k^s cap I_k^d|``, send ``s_k - |I_k^s cap I_k^d|``;
    - src FULL, or src == dst == FULL: nothing moves.

    Returns ``(received, sent)``, arrays of the shares' shape.
    """
    s = np.asarray(src_shares, dtype=float)
    d = np.asarray(dst_shares, dtype=float)
    zero = np.zeros(np.broadcast_shapes(s.shape, d.shape))
    if src == Layout.FULL:
        return zero, zero.copy()
    p = s.shape[-1]
    if dst == Layout.FULL:
        return zero + (1.0 - s), zero + (p - 1) * s
    if src != dst:
        return zero + d * (1.0 - s), zero + s * (1.0 - d)
    s_lo, s_hi = _bounds(s)
    d_lo, d_hi = _bounds(d)
    own = np.clip(np.minimum(s_hi, d_hi) - np.maximum(s_lo, d_lo), 0.0, None)
    return zero + np.clip(d - own, 0.0, None), zero + np.clip(s - own, 0.0, None)


def transition(prev: PartType, prev_shares: np.ndarray, cur: PartType,
               cur_shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fractions of ``|F| (= |E|)`` each side receives and sends between producer and consumer.

    Forward, F goes from ``OUT[prev]`` to ``IN[cur]``; backward, E goes from ``IN[cur]``
    back to ``OUT[prev]`` (docs/references.md: AccPar, the transition table).
    """
    f_recv, f_sent = convert(OUT_LAYOUT[prev], prev_shares, IN_LAYOUT[cur], cur_shares)
    e_recv, e_sent = convert(IN_LAYOUT[cur], cur_shares, OUT_LAYOUT[prev], prev_shares)
    return f_recv + e_recv, f_sent + e_sent


def join_transition(src: PartType, src_shares: np.ndarray, join: PartType,
                    join_shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fractions of the joined tensor moved by a residual join (source output -> join output).

    The shortcut's F is converted into the layout the joining layer makes its output in, and
    the error of the sum is converted back into the layout the source needs it in.
    """
    f_recv, f_sent = convert(OUT_LAYOUT[src], src_shares, OUT_LAYOUT[join], join_shares)
    e_recv, e_sent = convert(OUT_LAYOUT[join], join_shares, OUT_LAYOUT[src], src_shares)
    return f_recv + e_recv, f_sent + e_sent


def equal_table(join: bool = False) -> np.ndarray:
    """3 x 3 table: fraction of |F| one of two equal sides receives, [previous][current]."""
    half = np.array([0.5, 0.5])
    move = join_transition if join else transition
    return np.array([[float(move(a, half, b, half)[0][0]) for b in TYPES] for a in TYPES])


def integer_split(n: int, shares: np.ndarray | list[float]) -> list[int]:
    """Split ``n`` items into parts proportional to ``shares`` (largest remainder).

    Every part gets at least one item when ``n >= len(shares)``, so no side is left with an
    empty slice of a tensor it has to compute on.
    """
    w = np.asarray(shares, dtype=float)
    if n < 0 or w.ndim != 1 or not len(w) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"cannot split {n} by shares {list(w)}")
    exact = w / w.sum() * n
    parts = np.floor(exact).astype(int)
    for k in np.argsort(-(exact - parts), kind="stable")[: n - int(parts.sum())]:
        parts[k] += 1
    if n >= len(w):
        while (parts == 0).any():
            parts[int(np.argmax(parts))] -= 1
            parts[int(np.argmin(parts))] += 1
    return [int(x) for x in parts]
