"""Error feedback (the Memory interface of GRACE): what a worker did not send is not lost.

- ``none``: nothing is remembered.
- ``residual`` (Seide et al. 2014; Stich et al. NeurIPS'18; Karimireddy et al. ICML'19):
  p = beta * e + gamma * x is compressed; e <- p - local, where local is this worker's own
  decompressed contribution. With beta = gamma = 1 the sum over steps of what was sent plus
  the final residual equals the sum of the gradients (conservation; tests check it).
- ``dgc`` (Lin et al., ICLR'18, Algorithm "momentum correction" and "momentum factor
  masking"): u <- m u + x (local momentum), v <- v + u; v is compressed; after sending,
  v <- v - local and u is zeroed where something was sent. Use it with plain SGD (no
  optimizer momentum): the momentum lives here.
- ``powersgd`` (Vogels et al., NeurIPS'19, Algorithm 2): p = x + e is compressed;
  e <- p - average, the decompressed result averaged over workers (PowerSGD's low-rank
  factors are shared, so a worker has no decompression of its own), as torch's
  ``powerSGD_hook`` keeps it (for the uncompressed vectors too).

Memories key their state by the tensor's name (bucket key and size).
"""

from __future__ import annotations

import torch

from dlcomm.compress.base import MEMORIES, Memory
from dlcomm.registry import reject_unknown, take_option

__all__ = ["NoMemory", "ResidualMemory", "DGCMemory", "PowerSGDMemory"]


def _difference(a: torch.Tensor, b: torch.Tensor, into: torch.Tensor | None) -> torch.Tensor:
    """a - b, written over ``into`` (the state it replaces) where it fits: no new tensor of
    a bucket's size each step, whose fresh pages the kernel zeroes first."""
    if into is not None and into.shape == a.shape and \
            into.data_ptr() not in (a.data_ptr(), b.data_ptr()):
        return torch.sub(a, b, out=into)
    return a - b


def _slot(store: dict[str, torch.Tensor], name: str, like: torch.Tensor) -> torch.Tensor:
    t = store.get(name)
    if t is None or t.numel() != like.numel():
        t = store[name] = torch.zeros_like(like)
    return t


class NoMemory(Memory):
    name = "none"
    needs_local = False
    keeps = False

    def compensate(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return tensor

    def holds(self, name: str) -> bool:
        return False

    def update(self, compensated: torch.Tensor, name: str, local: torch.Tensor | None,
               average: torch.Tensor) -> None:
        return None


class ResidualMemory(Memory):
    name = "residual"

    def __init__(self, beta: float = 1.0, gamma: float = 1.0) -> None:
        self.beta, self.gamma = beta, gamma
        self.residuals: dict[str, torch.Tensor] = {}

    def compensate(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        e = self.residuals.get(name)
        if e is None or e.numel() != tensor.numel():
            return tensor * self.gamma if self.gamma != 1 else tensor.clone()
        if self.gamma != 1:
            return (tensor * self.gamma).add_(e, alpha=self.beta)
        return torch.add(tensor, e, alpha=self.beta)  # one pass, one new tensor

    def update(self, compensated: torch.Tensor, name: str, local: torch.Tensor | None,
               average: torch.Tensor) -> None:
        sent = local if local is not None else average
        self.residuals[name] = _difference(compensated, sent, self.residuals.get(name))

    def forget(self, name: str) -> None:
        self.residuals.pop(name, None)

    def holds(self, name: str) -> bool:
        return name in self.residuals

    def reset(self) -> None:
        self.residuals.clear()


class DGCMemory(Memory):
    name = "dgc"

    def __init__(self, momentum: float = 0.9) -> None:
        self.momentum = momentum
        self.u: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}

    def compensate(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        u = _slot(self.u, name, tensor)
        v = _slot(self.v, name, tensor)
        u.mul_(self.momentum).add_(tensor)
        v.add_(u)
        return v.clone()

    def update(self, compensated: torch.Tensor, name: str, local: torch.Tensor | None,
               average: torch.Tensor) -> None:
        sent = local if local is not None else average
        self.v[name] = _difference(compensated, sent, self.v.get(name))
        self.u[name].masked_fill_(sent != 0, 0.0)

    def forget(self, name: str) -> None:
        self.u.pop(name, None)
        self.v.pop(name, None)

    def reset(self) -> None:
        self.u.clear()
        self.v.clear()


class PowerSGDMemory(ResidualMemory):
    name = "powersgd"
    needs_local = False

    def __init__(self) -> None:
        super().__init__(1.0, 1.0)

    def update(self, compensated: torch.Tensor, name: str, local: torch.Tensor | None,
               average: torch.Tensor) -> None:
        self.residuals[name] = _difference(compensated, average, self.residuals.get(name))


@MEMORIES.register("none", "no error feedback")
def _none(**options: str) -> Memory:
    reject_unknown(options, "memory 'none'")
    return NoMemory()


@MEMORIES.register("residual", "e = p - decompress(compress(p)), p = beta e + gamma x")
def _residual(**options: str) -> Memory:
    beta = take_option(options, "beta", float, 1.0, "memory 'residual'")
    gamma = take_option(options, "gamma", float, 1.0, "memory 'residual'")
    reject_unknown(options, "memory 'residual'")
    return ResidualMemory(beta, gamma)


@MEMORIES.register("dgc", "DGC momentum correction and masking (momentum=0.9)")
def _dgc(**options: str) -> Memory:
    momentum = take_option(options, "momentum", float, 0.9, "memory 'dgc'", lambda v: 0 <= v < 1,
                      "0 <= momentum < 1")
    reject_unknown(options, "memory 'dgc'")
    return DGCMemory(momentum)


@MEMORIES.register("powersgd", "PowerSGD's: e = p - the averaged low-rank result")
def _powersgd(**options: str) -> Memory:
    reject_unknown(options, "memory 'powersgd'")
    return PowerSGDMemory()
