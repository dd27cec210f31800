"""Recommendation models: DLRM on Criteo Kaggle and NeuMF (NCF) on MovieLens-20M.

A sample is one record (a click record for DLRM, a user-item pair for NCF). Embedding
layers have ``in_elems`` = lookups per sample (one per categorical feature, both data sets
are one-hot), ``c_in`` = table rows, ``c_out`` = vector width, no FLOPs (a gather); their
gradients are row-sparse (see :meth:`ModelTable.sparse_layers`). Where a layer takes a
second input (DLRM's interaction of the bottom-MLP output with the embeddings, NeuMF's
concatenations), ``shortcut_from`` names that input's producer.
"""

from __future__ import annotations

from dlcomm.workloads.catalog.base import Layer, ModelTable, register_model

__all__ = ["CRITEO_KAGGLE_ROWS", "dlrm_layers", "ncf_layers", "mlp_layers"]

# Rows of the 26 categorical features of the Criteo Kaggle display-advertising data as
# DLRM's reference pre-processing counts them (facebookresearch/dlrm, the `ln_emb` of its
# Kaggle configuration; torchrec's DLRM example lists the same numbers).
CRITEO_KAGGLE_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683,
                      8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18,
                      15, 286181, 105, 142572)


def mlp_layers(prefix: str, widths: tuple[int, ...], join: str | None = None) -> list[Layer]:
    """Dense layers ``widths[0] -> widths[1] -> ...`` on one row each, with an activation
    (ReLU or the final sigmoid, 1 FLOP per output element) folded in."""
    layers = []
    for i, (w_in, w_out) in enumerate(zip(widths, widths[1:])):
        layers.append(Layer(f"{prefix}.{i}", "linear", w_in * w_out + w_out,
                            2.0 * w_in * w_out + w_out, w_in, w_out, w_in, w_out,
                            shortcut_from=join if i == 0 else None))
    return layers


def _embedding(name: str, rows: int, dim: int) -> Layer:
    return Layer(name, "embedding", rows * dim, 0.0, 1, dim, rows, dim)


def dlrm_layers(rows: tuple[int, ...] = CRITEO_KAGGLE_ROWS, dim: int = 16,
                bottom: tuple[int, ...] = (13, 512, 256, 64, 16),
                top: tuple[int, ...] = (512, 256, 1)) -> tuple[Layer, ...]:
    """DLRM (Naumov et al. 2019) with dot interaction, in the reference code's order.

    1. bottom MLP on the 13 dense features -> a vector of width ``dim``;
    2. one lookup in each of the 26 tables -> 26 vectors of width ``dim``;
    3. interaction: the Gram matrix of the 27 vectors (the reference computes the full
       27 x 27 batched product, 2 * 27^2 * dim FLOPs), its 351 strictly-lower entries
       concatenated with the bottom output -> 367 features;
    4. top MLP 367 -> 512 -> 256 -> 1 and a sigmoid.
    """
    if bottom[-1] != dim:
        raise ValueError("the bottom MLP must end at the embedding width")
    vectors = len(rows) + 1
    pairs = vectors * (vectors - 1) // 2
    layers = mlp_layers("bot_mlp", bottom)
    layers += [_embedding(f"emb.{i}", n, dim) for i, n in enumerate(rows)]
    layers.append(Layer("interaction", "other", 0, 2.0 * vectors * vectors * dim,
                        vectors * dim, pairs + dim, dim, pairs + dim,
                        shortcut_from=f"bot_mlp.{len(bottom) - 2}"))
    layers += mlp_layers("top_mlp", (pairs + dim, *top))
    return tuple(layers)


def ncf_layers(users: int = 138493, items: int = 26744, mf_dim: int = 64,
               mlp: tuple[int, ...] = (256, 256, 128, 64)) -> tuple[Layer, ...]:
    """NeuMF (He et al., WWW 2017) as in the MLPerf reference.

    GMF: user and item vectors of width ``mf_dim``, multiplied element-wise. MLP: user and
    item vectors of width ``mlp[0] / 2`` each, concatenated, then dense layers
    ``mlp[0] -> mlp[1] -> ...`` with ReLU. The GMF product and the MLP output are
    concatenated into one logistic unit.
    """
    half = mlp[0] // 2
    layers = [_embedding("mf_user", users, mf_dim), _embedding("mf_item", items, mf_dim),
              Layer("gmf", "other", 0, float(mf_dim), 2 * mf_dim, mf_dim, mf_dim, mf_dim,
                    shortcut_from="mf_user"),
              _embedding("mlp_user", users, half), _embedding("mlp_item", items, half)]
    layers += mlp_layers("mlp", mlp, join="mlp_user")
    layers += [Layer("final", "linear", (mlp[-1] + mf_dim) + 1, 2.0 * (mlp[-1] + mf_dim) + 1,
                     mlp[-1] + mf_dim, 1, mlp[-1] + mf_dim, 1, shortcut_from="gmf")]
    return tuple(layers)


@register_model("dlrm", "DLRM, Criteo Kaggle configuration (540M, 26 tables of width 16)")
def dlrm() -> ModelTable:
    return ModelTable(
        "dlrm", "recommender", dlrm_layers(), "click record (13 dense + 26 categorical)",
        540e6,
        "facebookresearch/dlrm bench/dlrm_s_criteo_kaggle.sh (sparse width 16, bottom "
        "13-512-256-64-16, top 512-256-1) with the Kaggle table sizes: ~540M parameters, "
        "2.16 GB in fp32 (unverified: the DLRM paper prints no count for this configuration)",
        128)


@register_model("ncf", "NeuMF (NCF), MLPerf configuration on MovieLens-20M (31.8M)")
def ncf() -> ModelTable:
    return ModelTable(
        "ncf", "recommender", ncf_layers(), "user-item pair", 31.8e6,
        "MLPerf Training reference NCF (He et al. 2017): ml-20m with 138,493 users and "
        "26,744 items, GMF width 64, MLP 256-256-128-64 -> 31.8M (unverified: derived "
        "from the reference configuration, no independently printed count)", 65536)
