"""The job's rendezvous store, hosted by its launcher: no free-port race.

torch.distributed's env:// rendezvous normally has rank 0 bind MASTER_PORT, so a launcher
that picks a "free" port must hope nobody takes it before rank 0 binds it. Instead, the
launcher binds the store itself (port 0: the kernel's choice, atomically) and tells every
rank to connect as a client (``TORCHELASTIC_USE_AGENT_STORE``, torch's own convention for
an agent-hosted store, as torchrun does). On an emulated cluster the store is created
inside rank 0's network namespace (a thread of the launcher enters it for the moment of
the bind; the listening socket stays there), so the workers reach it on their network.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import threading
from typing import Any

from dlcomm.errors import ConfigError

__all__ = ["hosted_store", "AGENT_STORE_VAR"]

AGENT_STORE_VAR = "TORCHELASTIC_USE_AGENT_STORE"
_CLONE_NEWNET = 0x40000000


def _enter_netns(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (``ip netns`` names)."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def hosted_store(addr: str, port: int = 0, netns: str | None = None,
                 timeout_s: float = 300.0) -> Any:
    """A TCPStore server on ``addr:port`` (0: any free port; ``.port`` says which), in
    network namespace ``netns`` if given. A port that is taken is a one-line ConfigError."""
    import torch.distributed as dist

    box: dict[str, Any] = {}

    def create() -> None:
        try:
            if netns:
                _enter_netns(netns)
            # torch re-exports TCPStore from its C module without declaring it
            box["store"] = dist.TCPStore(addr, port, None, True,  # type: ignore[attr-defined]
                                         datetime.timedelta(seconds=timeout_s),
                                         wait_for_workers=False)
        except Exception as exc:  # noqa: BLE001 (re-raised below, in the caller's thread)
            box["error"] = exc

    if netns:  # a thread of its own: the namespace change must not touch the caller's
        worker = threading.Thread(target=create, name="dlcomm-store")
        worker.start()
        worker.join()
    else:
        create()
    if "error" in box:
        where = f"{addr}:{port}" + (f" in {netns}" if netns else "")
        first = str(box["error"]).strip().splitlines()[0] if str(box["error"]).strip() else ""
        raise ConfigError(f"cannot host the rendezvous on {where}: {first}") from box["error"]
    return box["store"]
