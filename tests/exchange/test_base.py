import pytest
import torch

from dlcomm.errors import ConfigError, RegistryError
from dlcomm.exchange import EXCHANGES, ExchangeContext, ExchangeHookState, make_exchange


def test_single_worker_ring_is_identity_and_counts_nothing():
    ex = make_exchange("ring", ExchangeContext(rank=0, world_size=1))
    x = torch.arange(5, dtype=torch.float32)
    assert torch.equal(ex.allreduce(x).wait(), torch.arange(5, dtype=torch.float32))
    s = ex.stats()
    assert (s.calls, s.elements, s.bytes_sent, s.counting) == (1, 5, 0, "modelled")


def test_unknown_exchange_and_bad_options():
    ctx = ExchangeContext(0, 1)
    with pytest.raises(RegistryError, match="unknown exchange 'nope'"):
        make_exchange("nope", ctx)
    with pytest.raises(ConfigError, match="takes no options"):
        make_exchange("ring:x=1", ctx)
    assert "ring" in EXCHANGES


def test_hook_state_validates():
    ex = make_exchange("ring", ExchangeContext(0, 1))
    with pytest.raises(ValueError):
        ExchangeHookState(ex, 0)
