"""dlcomm in one's own torch script.

- **The c10d backend** (:mod:`.backend`): ``torch.distributed.init_process_group(backend=
  "dlcomm")`` in any torch program (torchrun, any env:// launcher): large float all-reduces
  (DDP's gradient buckets, ``dist.all_reduce``) go through the exchange named by
  ``$DLCOMM_EXCHANGE`` (default ``switch``), everything else through gloo. Registered by
  this import and, through a package entry point, by ``import torch`` (docs/torch.md).
- **A DDP comm hook for every exchange**: :func:`hook` (``compression_hook`` is its older
  name, for compression).

This package is imported by torch's backend autoload while torch itself is still being
imported, so it imports nothing else of dlcomm until a name below is used.
"""

from typing import Any

from dlcomm.torch.autoload import register

register()

_LAZY = {
    "hook": "dlcomm.torch.hooks", "compression_hook": "dlcomm.torch.hooks",
    "HookState": "dlcomm.torch.hooks", "CompressionHookState": "dlcomm.torch.hooks",
    "compressed_bucket_hook": "dlcomm.torch.hooks",
    "BackendOptions": "dlcomm.torch.config", "stats": "dlcomm.torch.backend",
    "DlcommProcessGroup": "dlcomm.torch.backend",
}

__all__ = ["register", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'dlcomm.torch' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
