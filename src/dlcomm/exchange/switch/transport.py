"""The worker's I/O shell: one UDP socket (and, where the job's results come to a group
that several workers of this host share, that group's socket) and one thread that drives
:class:`AllreduceOp`s.

:meth:`Transport.submit` queues a tensor; the I/O thread builds its op (dense or sparse),
runs it to the end and resolves the Future with a :class:`Finished` (the summed tensor and
what the op learnt of the tensor's sparsity), or fails it with the op's error. Operations
run one after another in submission order (DDP hands buckets over in order). Every byte
sent and received is counted here, on dlcomm's own socket.
"""

from __future__ import annotations

import queue
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from dlcomm.errors import ExchangeError
from dlcomm.exchange.switch.native_ops import usable
from dlcomm.exchange.switch.receiver import Receiver
from dlcomm.exchange.switch.sparse_kernels import PYTHON, native_kernels
from dlcomm.exchange.switch.sparse_window import SparseAllreduceOp
from dlcomm.exchange.switch.window import (
    AllreduceOp,
    RttEstimator,
    Send,
    Shard,
    Timing,
    send_error,
)
from dlcomm.native import available
from dlcomm.wire.sparse import Presence, present_blocks

if TYPE_CHECKING:
    from dlcomm.exchange.switch.native_ops import NativeOps

__all__ = ["Transport", "TransportStats", "Request", "Finished"]

CLOSED = "the switch exchange was closed with an all-reduce in flight"


@dataclass(frozen=True)
class Request:
    """One all-reduce to run: in place on ``flat``, dense or in sparse rounds."""

    flat: torch.Tensor
    sparse: bool = False
    block: int = 0                      # sparse rounds: the block size
    threshold: float = 0.0              # sparse rounds: blocks at or below are not sent
    presence: Presence | None = None    # the tensor's present blocks, if already known
    count: bool = False                 # dense: count the result's blocks that hold data


@dataclass(frozen=True)
class Finished:
    """A completed all-reduce: the sum (in the request's tensor) and what was seen of it."""

    total: torch.Tensor
    sums: np.ndarray                    # the same memory, as numpy
    sparse: bool
    blocks: int = 0                     # sparse, or counted: blocks of the tensor (0: not)
    union_blocks: int = 0               # of them: sent by some worker (sparse), non-zero in
                                        # the sum (counted)


@dataclass
class TransportStats:
    packets_sent: int = 0
    packets_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    retransmissions: int = 0
    drops_injected: int = 0
    malformed: int = 0           # datagrams that did not verify (forged, replayed, broken)
    ops: int = 0
    extra: dict[str, int] = field(default_factory=dict)


def _fail(fut: torch.futures.Future[Finished], exc: BaseException) -> None:
    # torch's stub types set_exception's argument as the Future's result type
    fut.set_exception(exc)  # type: ignore[arg-type]


class Transport:
    def __init__(self, sock: socket.socket, rank: int, workers: int, k: int,
                 shards: list[Shard], timing: Timing, drop_rate: float = 0.0, seed: int = 0,
                 failure: Callable[[], str | None] = lambda: None,
                 client: str = "native", results: socket.socket | None = None) -> None:
        self.sock, self.rank, self.workers, self.k = sock, rank, workers, k
        # the worker's socket, and the results' own (bootstrap.Session.results) if any
        self._receiver = Receiver(*((sock,) if results is None else (sock, results)))
        self.shards, self.timing = shards, timing
        self.seqs = [[0] * sh.slots for sh in shards]
        self.rtt = RttEstimator(timing)
        self.drop_rate = drop_rate
        self.rng = random.Random(seed * 7919 + rank)
        self.failure = failure
        self._closing = threading.Event()
        self.stats = TransportStats()
        self.broken: ExchangeError | None = None
        self.native: NativeOps | None = None
        # sparse rounds: the window in Python, its quantization loops in C with the client
        self.kernels = native_kernels() if client == "native" and available() else PYTHON
        if client == "native" and usable(workers, shards):
            from dlcomm.exchange.switch.native_ops import NativeOps

            self.native = NativeOps(sock.fileno(), rank, workers, k, shards, timing,
                                    drop_rate, seed,
                                    results.fileno() if results is not None else -1)
        self._ops: queue.Queue[tuple[Request, torch.futures.Future[Finished]] | None] = \
            queue.Queue()
        self._thread = threading.Thread(target=self._run, name="dlcomm-switch-io", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> torch.futures.Future[Finished]:
        """Queue an all-reduce (in place on ``request.flat``); the Future says how it ended."""
        fut: torch.futures.Future[Finished] = torch.futures.Future()
        if self.broken is not None:
            _fail(fut, self.broken)
        else:
            self._ops.put((request, fut))
        return fut

    def close(self) -> bool:
        """Stop the I/O thread: an op in flight fails at its next look at the control
        channel (0.2 s at most). True if it stopped; if not, the sockets it reads must stay
        open (their numbers could go to other sockets it would then read and write)."""
        self._closing.set()
        self._ops.put(None)
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            return False
        if self.native is not None:
            self.native.close()
        return True

    def _failure(self) -> str | None:
        """Why the op in flight must stop: the exchange was closed, or the control
        channel's reason."""
        return CLOSED if self._closing.is_set() else self.failure()

    # -- the I/O thread ------------------------------------------------------------------
    def _send(self, sends: list[Send]) -> None:
        for addr, parts in sends:
            if self.drop_rate and self.rng.random() < self.drop_rate:
                self.stats.drops_injected += 1
                continue
            try:
                n = self.sock.sendmsg(parts, [], 0, addr)
            except OSError as exc:
                raise send_error(addr, exc.strerror or str(exc)) from exc
            self.stats.packets_sent += 1
            self.stats.bytes_sent += n

    def _run(self) -> None:
        buf = bytearray(1 << 16)
        view = memoryview(buf)
        while True:
            item = self._ops.get()
            if item is None:
                return
            request, fut = item
            if self._closing.is_set() and self.broken is None:
                self.broken = ExchangeError(CLOSED)
            if self.broken is not None:
                _fail(fut, self.broken)
                continue
            try:
                finished = self._run_op(request, view, buf)
            except ExchangeError as exc:
                self.broken = exc  # the job's slot rounds may now differ between workers
                _fail(fut, exc)
                continue
            except Exception as exc:  # noqa: BLE001 (reported through the Future)
                self.broken = ExchangeError(f"switch client failed: {exc!r}")
                _fail(fut, self.broken)
                continue
            self.stats.ops += 1
            fut.set_result(finished)

    def _control_failure(self, grace_s: float = 0.5) -> str | None:
        """The control channel's reason for a failed op, if it has one: a switch that drops
        a job because a worker left answers the others' packets with "unknown job" at once,
        and the event naming the worker may arrive a moment later, so wait for it briefly."""
        deadline = time.monotonic() + grace_s
        while (failure := self.failure()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return failure

    def _new_op(self, request: Request, data: np.ndarray) -> AllreduceOp:
        if request.sparse:
            return SparseAllreduceOp(data, data, self.rank, self.workers, self.k, self.shards,
                                     self.seqs, self.timing, self.rtt, block=request.block,
                                     threshold=request.threshold, presence=request.presence,
                                     kernels=self.kernels)
        return AllreduceOp(data, data, self.rank, self.workers, self.k, self.shards, self.seqs,
                           self.timing, self.rtt)

    def _run_native(self, request: Request, data: np.ndarray) -> Finished:
        assert self.native is not None
        t0 = time.perf_counter()
        moved = self.native.run(data, self.seqs, self._failure, self._control_failure,
                                request.block if request.sparse else 0, request.presence,
                                request.block if request.count else 0)
        st = self.stats
        st.packets_sent += moved["packets_sent"]
        st.bytes_sent += moved["bytes_sent"]
        st.packets_received += moved["packets_received"]
        st.bytes_received += moved["bytes_received"]
        st.retransmissions += moved["retransmissions"]
        st.malformed += moved["rejected"]
        st.drops_injected += moved["drops_injected"]
        st.extra["probes"] = st.extra.get("probes", 0) + moved["probes"]
        st.extra["op_us"] = st.extra.get("op_us", 0) + int((time.perf_counter() - t0) * 1e6)
        st.extra["native_ops"] = st.extra.get("native_ops", 0) + 1
        flat = request.flat
        if not flat.is_contiguous():
            flat.copy_(torch.from_numpy(data))
        if request.sparse or request.count:
            return Finished(flat, data, request.sparse, -(-len(data) // request.block),
                            self.native.union_blocks())
        return Finished(flat, data, False)

    def _run_op(self, request: Request, view: memoryview, buf: bytearray) -> Finished:
        flat = request.flat
        data = flat.detach().numpy() if flat.is_contiguous() else flat.contiguous().numpy()
        if self.native is not None and (not request.sparse or request.threshold == 0):
            return self._run_native(request, data)   # sparse with a threshold: in Python
        t0 = time.perf_counter()
        op = self._new_op(request, data)
        sends = op.start(time.monotonic())
        t1 = time.perf_counter()
        op.allow_skew(t1 - t0)
        extra = self.stats.extra
        extra["prepare_us"] = extra.get("prepare_us", 0) + int((t1 - t0) * 1e6)
        self._send(sends)
        next_check = time.monotonic() + 0.2
        while not op.done:
            now = time.monotonic()
            if now >= next_check:  # a dead peer or switch, reported on the control channel
                next_check = now + 0.2
                failure = self._failure()
                if failure:
                    raise ExchangeError(failure)
            wait = op.next_deadline() - now
            if wait <= 0:
                self._send(op.on_timeout(now))
                continue
            try:
                n, src = self._receiver.receive(buf, min(wait, 0.1))
            except TimeoutError:
                continue
            if self.drop_rate and self.rng.random() < self.drop_rate:
                self.stats.drops_injected += 1
                continue
            self.stats.packets_received += 1
            self.stats.bytes_received += n
            self._send(op.on_datagram(view[:n], src, time.monotonic()))
        extra["op_us"] = extra.get("op_us", 0) + int((time.perf_counter() - t0) * 1e6)
        self.stats.retransmissions += op.retransmissions
        self.stats.malformed += op.rejected
        self.stats.extra["probes"] = self.stats.extra.get("probes", 0) + op.probes
        if op.error is not None:
            failure = self._control_failure()
            if failure:
                raise ExchangeError(failure) from op.error
            raise op.error
        if not flat.is_contiguous():
            flat.copy_(torch.from_numpy(data))
        if isinstance(op, SparseAllreduceOp):
            return Finished(flat, data, True, len(op.mask), op.union_blocks)
        if request.count:  # what the native client counts as the results come in
            present, _ = present_blocks(data, request.block)
            return Finished(flat, data, False, len(present), int(present.sum()))
        return Finished(flat, data, False)
