"""Megatron-LM on Selene: the compute model, nodes, rings, and the reproduction's rows."""

from __future__ import annotations

import numpy as np
import pytest

from dlcomm.errors import ConfigError
from dlcomm.plan.commtime import place_ranks
from dlcomm.plan.simulate.busbw import bus_bandwidth, reproduce_nccl
from dlcomm.plan.simulate.fluid import SimNetwork
from dlcomm.plan.simulate.megatron import (
    GPT3_ROWS,
    TABLE1,
    MegatronRow,
    _parts,
    megatron_flops,
    reproduce_megatron,
    simulate_row,
)
from dlcomm.plan.simulate.megatron_compute import gpt_layer_times
from dlcomm.plan.topology import build_topology
from dlcomm.plan.traffic import Parallelism
from dlcomm.results import validate_result
from dlcomm.workloads.accelerators import get_accelerator
from dlcomm.workloads.catalog.transformer import transformer_layers
from dlcomm.workloads.kernels import KernelModel


def test_flops_formula_and_parameter_counts_match_the_paper() -> None:
    for row in TABLE1:
        params = sum(layer.params for layer in transformer_layers(row.config()))
        assert params / 1e9 == pytest.approx(row.params_b, abs=0.06)   # Eq. 2
    one = TABLE1[0]
    assert megatron_flops(one) == pytest.approx(96 * 512 * 2048 * 24 * 2304**2 * (
        1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304)))


def test_recomputation_adds_the_forward_to_block_backwards_only() -> None:
    cfg = TABLE1[0].config()
    km = KernelModel(get_accelerator("a100"))
    f, b = gpt_layer_times(cfg, km, 4, 1, recompute=False)
    f2, b2 = gpt_layer_times(cfg, km, 4, 1, recompute=True)
    names = [layer.name for layer in transformer_layers(cfg)]
    for name, fw, bw, bw2 in zip(names, f, b, b2):
        assert bw2 == pytest.approx(bw + (fw if name.startswith("h.") else 0.0))
    assert f == f2
    # tensor parallelism splits the GEMMs, not the replicated norms
    ft, _ = gpt_layer_times(cfg, km, 4, 8, recompute=False)
    assert ft[names.index("h.0.mlp.fc")] < f[names.index("h.0.mlp.fc")] / 4
    assert ft[names.index("h.0.ln_1")] == f[names.index("h.0.ln_1")]


def test_virtual_stages_split_blocks_evenly() -> None:
    row = TABLE1[5]                           # 60 layers, p 4 x v 3: 5 blocks each
    layers = transformer_layers(row.config())
    n = len(layers)
    parts = _parts(row, layers)
    assert len(parts) == 12 and parts[0] == (0, 2 + 35) and parts[-1][1] == n
    assert all(b - a == 35 for a, b in parts[1:-1])
    with pytest.raises(ConfigError, match="virtual stages"):
        _parts(MegatronRow(1, 8, 512, 10, 1, 4, 4, 8, 1, 1), layers)


@pytest.mark.parametrize("row", [TABLE1[0], TABLE1[3], TABLE1[4]], ids=lambda r: f"{r.params_b}B")
def test_small_rows_land_within_ten_percent(row: MegatronRow) -> None:
    out = simulate_row(row)
    assert abs(out["error"]) <= 0.10, out
    assert out["iteration_s"] > out["compute_s"] > 0


def test_bad_split_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="micro-batches"):
        simulate_row(MegatronRow(1.7, 24, 2304, 24, 1, 1, 32, 500, 137, 16))
    with pytest.raises(ConfigError, match="do not split into tp"):
        simulate_row(MegatronRow(1.7, 24, 2304, 24, 8, 2, 8, 512, 137, 16))


def test_nodes_topology_routes_inside_over_nvlink_and_between_over_nics() -> None:
    topo = build_topology("nodes:n=16,node=dgx-a100")
    g = topo.graph()
    assert topo.accelerators == 16 and topo.nodes == 2
    assert g.edges[0, ("nvs", 0)]["capacity"] == pytest.approx(2400 * 0.8)
    assert g.edges[0, ("nic", 0)]["capacity"] == pytest.approx(200 * 0.96)
    assert topo.bus_gbps() == pytest.approx(8 * 192)
    assert topo.bisection_gbps() == 8 * 200                 # line rates, as elsewhere
    for bad in ("nodes:n=16,node=dgx-z", "nodes:n=16,rate=100", "nodes:n=16,ports=2",
                "nodes:n=16,nvlink=inf", "nodes:n=16,nic=0"):
        with pytest.raises(ConfigError):
            build_topology(bad)
    # routes: inside a node through its NVSwitch, between nodes through both GPUs' NICs
    par = Parallelism(dp=16, batch=1, micro=1)
    net = SimNetwork(topo, place_ranks(par, 16, "linear", 0))
    ids = net.net.node_ids([0, 1, 8])
    inside = net.flows("in", np.array([0]), np.array([1]))
    across = net.flows("out", np.array([0]), np.array([8]))
    assert inside.hops == 2 and across.hops == 4
    assert len(ids) == 3


def test_bus_bandwidth_matches_the_closed_form_and_nccl_tests() -> None:
    one = bus_bandwidth("dgx-a100", 8, 8e9)
    assert one["busbw_GBps"] == pytest.approx(2400 * 0.8 / 8, rel=0.01)
    many = bus_bandwidth("dgx-a100", 64, 8e9, algorithm="rails:8")
    assert many["busbw_GBps"] == pytest.approx(8 * 24, rel=0.01)
    ring = bus_bandwidth("dgx-a100", 64, 8e9, algorithm="ring")
    assert ring["busbw_GBps"] < many["busbw_GBps"] / 2     # one NIC per node per direction
    result = reproduce_nccl()
    validate_result(result)
    assert result["summary"]["within_10pct"] == result["summary"]["modelled_cases"] == 3
    assert result["summary"]["independent_cases"] == 0     # said, not hidden


@pytest.mark.slow
def test_every_row_within_ten_percent() -> None:
    result = reproduce_megatron(rows=TABLE1 + GPT3_ROWS)
    assert len(result["summary"]["gemm_ceiling_sensitivity"]["rows"]) == 4
    validate_result(result)
    assert result["summary"]["within_10pct"] == len(TABLE1) + len(GPT3_ROWS)


def test_the_kernel_model_and_interleaving_on_the_simulate_command() -> None:
    from dlcomm.plan.simulate.iteration import SimConfig, simulate

    base = dict(workload="gpt2-1.5b", topology="nodes:node=dgx-a100", accelerators=16,
                parallelism="dp=2,pp=4,tp=2,micro=8,batch=8", accelerator="a100",
                algorithm="nccl")
    flat = simulate(SimConfig(**base))["summary"]
    kernels = simulate(SimConfig(**base, compute="kernels", recompute=True))["summary"]
    chunked = simulate(SimConfig(**base, compute="kernels", recompute=True,
                                 schedule="interleaved", chunks=2))["summary"]
    assert kernels["compute_s"] != flat["compute_s"]
    assert chunked["bubble_s"] < kernels["bubble_s"]          # the interleaved schedule's point
    with pytest.raises(ConfigError, match="GPT models"):
        simulate(SimConfig("resnet50", "fattree", 8, accelerator="a100", compute="kernels"))
    with pytest.raises(ConfigError, match="interleaved"):
        SimConfig("gpt2-1.5b", chunks=2)
    with pytest.raises(ConfigError, match="kernel-model facts"):
        simulate(SimConfig("gpt2-1.5b", "fattree", 8, compute="kernels"))
