"""The ``dlcomm`` c10d backend: ``init_process_group(backend="dlcomm")``.

:class:`DlcommProcessGroup` is a Python ``ProcessGroup`` (torch calls its ``allreduce``
from Python and from C++ alike: ``dist.all_reduce``, DDP's reducer, comm hooks) with a
gloo backend registered for the CPU under it. Large float all-reduces with SUM or AVG go
through the configured exchange (:mod:`dlcomm.torch.routing`); every other collective
falls through to that gloo backend, untouched, so torch's semantics (work objects,
futures, timeouts, errors) are gloo's own. Why Python and not a C++ ``c10d::Backend``:
docs/torch.md.

Creation (inside ``init_process_group``, on every rank at once; the group is not usable
through ``torch.distributed`` yet, so everything goes through the job's store):

1. the configuration is checked (:func:`dlcomm.torch.config.resolve`);
2. the job's switch is joined or started (:mod:`dlcomm.torch.lifecycle`) and the exchange
   bootstraps (registration, tickets, keys) over the store: an unreachable switch or a
   wrong certificate or token fails here, on every rank, with the first rank's reason;
3. gloo connects.

Subgroups (``new_group``) are all gloo: one switch job per group would cost a registration
for every group a program makes. Leaving: ``destroy_process_group``, interpreter exit (an
exception included) close the exchange (the rank leaves its switch job) and stop the job's
own switch; a rank killed by a signal leaves with its sockets (the switch drops the job).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime
import threading
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Store

from dlcomm.errors import DlcommError
from dlcomm.exchange.base import Exchange, ExchangeContext, make_exchange
from dlcomm.exchange.objects import StoreObjects
from dlcomm.registry import Spec
from dlcomm.switch.service import SWITCH_EXCHANGES
from dlcomm.torch.config import BackendConfig, resolve
from dlcomm.torch.lifecycle import JobSwitch, join_or_start
from dlcomm.torch.routing import EXCHANGE, route_allreduce

__all__ = ["BACKEND", "DlcommProcessGroup", "create", "exchange_of", "stats"]

BACKEND = "dlcomm"
CPU = torch.device("cpu")
GLOO = dist.ProcessGroup.BackendType.GLOO
DEADLINE_S = 30.0   # the switch client's own deadline, unless the group's timeout is shorter
LEAVE_WAIT_S = 10.0  # rank 0 waits this long for the others to leave before its switch stops


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    message = text[0] if text else type(exc).__name__
    return message if isinstance(exc, DlcommError) else f"{type(exc).__name__}: {message}"


def _with_deadline(spec: Spec, timeout_s: float) -> Spec:
    """The switch client gives up within the group's timeout (torch's promise)."""
    if spec.name not in SWITCH_EXCHANGES or "deadline_s" in spec.options:
        return spec
    return Spec(spec.name, {**spec.options, "deadline_s": f"{min(DEADLINE_S, timeout_s):g}"})


def _flat_float32(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A flat float32 view of ``tensor`` if it is one, else a copy (``True``)."""
    if tensor.dtype == torch.float32 and tensor.is_contiguous():
        return tensor.detach().view(-1), False
    return tensor.detach().reshape(-1).to(torch.float32), True


class FutureWork(dist.Work):
    """A work object over a Future: ``wait`` raises the Future's exception, as a gloo
    work's does (torch's own ``_create_work_from_future`` returns True even then)."""

    def __init__(self, future: torch.futures.Future[list[torch.Tensor]]) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        self._future.wait()
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def result(self) -> list[torch.Tensor]:
        return self._future.value()


def _to_gloo(name: str, backend_name: str | None = None) -> Any:
    """A method that hands the call to the gloo backend as it is.

    Why not leave it to ``ProcessGroup``'s own method: torch's Python trampoline keeps the
    GIL while the inherited C++ method enqueues the work, and gloo's worker thread, which
    holds the queue's lock while it drops a finished work's Python-owned tensors, waits
    for the GIL: a deadlock seen about once in six runs. The backend's own binding lets
    the GIL go first."""
    target = backend_name or name

    def forward(self: DlcommProcessGroup, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._gloo, target)(*args, **kwargs)
    forward.__name__ = name
    forward.__doc__ = f"gloo's ``{target}``."
    return forward


def _coalesced(backend_name: str) -> Any:
    """One gloo call per (output, input) pair; the work completes when all have."""
    def run(self: DlcommProcessGroup, outputs: list[torch.Tensor],
            inputs: list[torch.Tensor], *opts: Any) -> Any:
        call = getattr(self._gloo, backend_name)
        futures = [call(o, i, *opts).get_future() for o, i in zip(outputs, inputs)]
        return FutureWork(torch.futures.collect_all(futures).then(lambda _: list(outputs)))
    run.__name__ = backend_name + "_coalesced"
    return run


class DlcommProcessGroup(dist.ProcessGroup):
    """A process group whose large float all-reduces go through a dlcomm exchange."""

    # every collective torch's trampoline would otherwise run with the GIL held
    allgather = _to_gloo("allgather")
    allreduce_coalesced = _to_gloo("allreduce_coalesced")
    barrier = _to_gloo("barrier")
    broadcast = _to_gloo("broadcast")
    send = _to_gloo("send")
    recv = _to_gloo("recv")
    reduce_scatter = _to_gloo("reduce_scatter")
    all_to_all_single = _to_gloo("all_to_all_single", "alltoall_base")
    all_gather_single_coalesced = _coalesced("_allgather_base")
    reduce_scatter_single_coalesced = _coalesced("_reduce_scatter_base")

    def __init__(self, store: Store, rank: int, size: int, timeout: datetime.timedelta,
                 config: BackendConfig, with_exchange: bool, job: str = "torch") -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # torch binds (rank, size)
        self.config = config
        self.routes: collections.Counter[str] = collections.Counter()
        self._exchange: Exchange | None = None
        self._switch: JobSwitch | None = None
        self._closed = False
        self._lock = threading.Lock()
        timeout_s = timeout.total_seconds()
        self._objects = StoreObjects(store, rank, size, timeout_s)
        # the exchange's own collectives (compression's side channels, the ring) go to a
        # gloo backend of their own through this bare group: never back through this
        # group's routing, and never interleaved, from the exchange's thread, with the
        # program's collectives on the main backend (gloo matches calls by their order)
        self._direct = dist.ProcessGroup(store, rank, size)
        self._direct_gloo: Any = None
        try:
            if with_exchange and config.uses_exchange and size > 1:
                self._open_exchange(rank, size, timeout_s, job)
            self._gloo: Any = ProcessGroupGloo(store, rank, size, timeout)  # (untyped stubs)
            if self._exchange is not None:
                self._direct_gloo = ProcessGroupGloo(PrefixStore("dlcomm-direct/", store),
                                                     rank, size, timeout)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self._objects.fail(_one_line(exc))
            self._close_exchange()
            raise
        self._register_backend(CPU, GLOO, self._gloo)
        self._direct._register_backend(CPU, GLOO, self._direct_gloo or self._gloo)
        self._direct._set_default_backend(GLOO)
        _track(self)

    def _open_exchange(self, rank: int, size: int, timeout_s: float, job: str) -> None:
        spec = _with_deadline(self.config.exchange, timeout_s)
        self._switch = join_or_start(spec, self._objects, rank, self.config.switch_bind,
                                     self.config.switch_stats)
        ctx = ExchangeContext(rank, size, group=self._direct, job_name=job,
                              objects=self._objects)
        self._exchange = make_exchange(self._switch.spec, ctx)

    # -- torch's interface -------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802  (torch's name)
        return BACKEND

    def allreduce(  # type: ignore[override]  # torch calls overrides as (tensors, opts)
            self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        if opts is None:
            opts = dist.AllreduceOptions()
        elif isinstance(opts, dist.ReduceOp | dist.ReduceOp.RedOpType):
            op, opts = opts, dist.AllreduceOptions()
            opts.reduceOp = op
        route = route_allreduce(self.config, self._exchange is not None, opts.reduceOp,
                                tensors)
        self.routes[route.reason] += 1
        if route.through == EXCHANGE:
            return self._through_exchange(tensors[0], opts.reduceOp == dist.ReduceOp.AVG)
        return self._gloo.allreduce(tensors, opts)

    def shutdown(self) -> None:
        self.close()
        with contextlib.suppress(Exception):
            super().shutdown()
        if self._direct_gloo is not None:
            with contextlib.suppress(Exception):
                self._direct_gloo.shutdown()

    # -- the two paths -----------------------------------------------------------------

    def _through_exchange(self, tensor: torch.Tensor, average: bool) -> Any:
        assert self._exchange is not None
        flat, staged = _flat_float32(tensor)
        size = self.size()
        done: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()

        def finish(fut: torch.futures.Future[torch.Tensor]) -> None:
            try:
                total = fut.value()
                if average:
                    total = total.div_(size)
                if staged or total.data_ptr() != flat.data_ptr():
                    tensor.detach().copy_(total.view(tensor.shape))
            except BaseException as exc:  # torch's error, dlcomm's reason in it
                error = dist.DistBackendError(f"dlcomm: {_one_line(exc)}")
                done.set_exception(error)  # type: ignore[arg-type]  # (stubs: the value type)
                return
            done.set_result([tensor])

        try:
            # per-tensor state (auto's density, error feedback) by what every rank sees
            # alike: the size (a storage address differs between ranks)
            key = f"numel{tensor.numel()}"
            self._exchange.allreduce(flat, key).add_done_callback(finish)
        except DlcommError as exc:
            raise dist.DistBackendError(f"dlcomm: {_one_line(exc)}") from exc
        return FutureWork(done)

    # -- dlcomm's side -----------------------------------------------------------------

    @property
    def exchange(self) -> Exchange | None:
        """The exchange large all-reduces go through (None: all gloo)."""
        return self._exchange

    @property
    def switch(self) -> JobSwitch | None:
        return self._switch

    def stats(self) -> dict[str, Any]:
        """What went where: the exchange's counters and the routing decisions."""
        exchange = self._exchange.stats().as_dict() if self._exchange else None
        return {"exchange": exchange, "routes": dict(self.routes),
                "spec": str(self._switch.spec) if self._switch else None}

    def close(self) -> None:
        """Leave the switch job; rank 0 stops the job's own switch once all have left
        (idempotent; called by ``destroy_process_group`` and at exit)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._close_exchange()

    def _close_exchange(self) -> None:
        if self._exchange is not None:
            with contextlib.suppress(Exception):
                self._exchange.close()
            self._exchange = None
        if self._switch is None:
            return
        with contextlib.suppress(Exception):
            self._objects.arrive("left")
            if self._switch.own:
                self._objects.missing("left", LEAVE_WAIT_S)
        self._switch.close()
        self._switch = None


def create(backend_opts: Any, pg_options: Any) -> DlcommProcessGroup:
    """torch's creator function (``Backend.register_backend(..., extended_api=True)``)."""
    config = resolve(pg_options)
    world = not backend_opts.global_ranks_in_group  # the default group: the job's exchange
    return DlcommProcessGroup(backend_opts.store, backend_opts.group_rank,
                              backend_opts.group_size, backend_opts.timeout, config,
                              with_exchange=world, job=f"torch-{backend_opts.group_id}")


def exchange_of(group: dist.ProcessGroup | None = None) -> DlcommProcessGroup:
    """The dlcomm process group behind ``group`` (default: the default group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, DlcommProcessGroup):
        raise DlcommError(f"the process group uses backend {dist.get_backend(pg)!r}, "
                          f"not {BACKEND!r}")
    return pg


def stats(group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """What the dlcomm group ``group`` (default: the default group) sent where."""
    return exchange_of(group).stats()


# -- leaving on exit and on signals -------------------------------------------------------

_LIVE: weakref.WeakSet[DlcommProcessGroup] = weakref.WeakSet()
_installed = False


def _close_all() -> None:
    for pg in list(_LIVE):
        pg.close()


def _track(pg: DlcommProcessGroup) -> None:
    """Close ``pg`` at interpreter exit if the program did not. Signals get no handler:
    a Python handler only runs between bytecodes, so a rank blocked in gloo would ignore
    SIGTERM; a rank that dies closes its control connections with it, and the switch
    drops its job at once (docs/torch.md)."""
    global _installed
    _LIVE.add(pg)
    if not _installed:
        _installed = True
        atexit.register(_close_all)
