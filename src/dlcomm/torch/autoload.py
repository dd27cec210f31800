"""Registers the ``dlcomm`` c10d backend with torch, cheaply.

Called by ``import dlcomm.torch`` and, through the ``torch.backends`` entry point that
dlcomm's package declares, by ``import torch`` itself (torch's device-backend autoload,
unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``): a torch program needs no import of dlcomm to
say ``init_process_group(backend="dlcomm")``. Nothing of dlcomm is imported until a group
is created, so every torch program pays only this module.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]

NAME = "dlcomm"


def _create(backend_opts: Any, pg_options: Any) -> Any:
    from dlcomm.torch.backend import create

    return create(backend_opts, pg_options)


def register() -> None:
    """Make ``backend="dlcomm"`` (and ``"cpu:dlcomm"``) known to torch.distributed."""
    import torch.distributed as dist

    if not dist.is_available() or NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
