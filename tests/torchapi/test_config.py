"""The backend's configuration and routing: pure, checked before any socket opens."""

import pytest
import torch
import torch.distributed as dist

from dlcomm.errors import ConfigError
from dlcomm.torch.config import BackendOptions, resolve
from dlcomm.torch.routing import EXCHANGE, GLOO, route_allreduce


def test_defaults_and_precedence():
    cfg = resolve(None, {})
    assert cfg.exchange.name == "switch" and cfg.min_bytes == 4096
    assert cfg.dtypes == {torch.float32, torch.float16, torch.bfloat16}
    env = {"DLCOMM_EXCHANGE": "auto:threshold=0", "DLCOMM_MIN_BYTES": "0",
           "DLCOMM_DTYPES": "float32,float64"}
    cfg = resolve(None, env)
    assert str(cfg.exchange) == "auto:threshold=0" and cfg.min_bytes == 0
    assert cfg.dtypes == {torch.float32, torch.float64}
    cfg = resolve(BackendOptions(exchange="sparse-switch", min_bytes=100), env)  # options win
    assert cfg.exchange.name == "sparse-switch" and cfg.min_bytes == 100
    assert resolve({"exchange": "ring"}, {}).uses_exchange is False


@pytest.mark.parametrize("options,env,message", [
    (None, {"DLCOMM_EXCHANGE": "swich"}, "unknown exchange 'swich'"),
    (None, {"DLCOMM_EXCHANGE": "switch:k"}, "expected key=value"),
    (None, {"DLCOMM_MIN_BYTES": "lots"}, "whole number of bytes"),
    (None, {"DLCOMM_MIN_BYTES": "-1"}, "must be >= 0"),
    (None, {"DLCOMM_DTYPES": "float32,int8"}, "unknown dtype(s) int8"),
    ({"exchnage": "ring"}, {}, "unknown option(s) exchnage"),
    (42, {}, "pg_options must be"),
])
def test_bad_configuration_is_one_clear_error(options, env, message):
    with pytest.raises(ConfigError, match=None) as err:
        resolve(options, env)
    assert message in str(err.value) and "\n" not in str(err.value)


CFG = resolve(None, {})


@pytest.mark.parametrize("op,dtype,numel,through,reason", [
    (dist.ReduceOp.SUM, torch.float32, 1024, EXCHANGE, "exchange"),
    (dist.ReduceOp.AVG, torch.bfloat16, 2048, EXCHANGE, "exchange"),
    (dist.ReduceOp.SUM, torch.float32, 1023, GLOO, "small"),      # 4092 bytes < 4096
    (dist.ReduceOp.MAX, torch.float32, 10_000, GLOO, "reduce op"),
    (dist.ReduceOp.PRODUCT, torch.float32, 10_000, GLOO, "reduce op"),
    (dist.ReduceOp.SUM, torch.float64, 10_000, GLOO, "dtype"),
    (dist.ReduceOp.SUM, torch.int64, 10_000, GLOO, "dtype"),
    (dist.ReduceOp.SUM, torch.int32, 10_000, GLOO, "dtype"),
])
def test_route(op, dtype, numel, through, reason):
    route = route_allreduce(CFG, True, op, [torch.zeros(numel, dtype=dtype)])
    assert (route.through, route.reason) == (through, reason)


def test_route_without_exchange_or_with_several_tensors():
    t = torch.zeros(10_000)
    assert route_allreduce(CFG, False, dist.ReduceOp.SUM, [t]).through == GLOO
    assert route_allreduce(CFG, True, dist.ReduceOp.SUM, [t, t]).reason == "several tensors"
    ring = resolve({"exchange": "ring"}, {})
    assert route_allreduce(ring, False, dist.ReduceOp.SUM, [t]).reason == "exchange ring"
