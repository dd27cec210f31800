"""The worker's I/O shell on real loopback sockets: GRO batches cut back into datagrams,
and a transport closed with an all-reduce in flight."""

from __future__ import annotations

import socket
import struct
import time

import pytest
import torch

from dlcomm.errors import ExchangeError
from dlcomm.exchange.switch.receiver import SOL_UDP, UDP_GRO, Receiver, gro_segment
from dlcomm.exchange.switch.transport import Request, Transport
from dlcomm.exchange.switch.window import Shard, Timing
from dlcomm.native import available
from dlcomm.wire.auth import AUTH_MAC, JobKeys
from dlcomm.wire.channel import Channel

UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)


def _pair() -> tuple[socket.socket, socket.socket]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    return rx, tx


def test_gro_segment_reads_the_control_message():
    size = struct.pack("i", 100)
    assert gro_segment([(SOL_UDP, UDP_GRO, size)], 250) == 100
    assert gro_segment([(SOL_UDP, UDP_GRO, size)], 60) == 60       # one short datagram
    assert gro_segment([(SOL_UDP, UDP_GRO, struct.pack("i", 0))], 250) == 250
    assert gro_segment([(socket.SOL_SOCKET, UDP_GRO, size)], 250) == 250
    assert gro_segment([], 0) == 0


def test_a_batch_left_whole_by_gro_is_cut_back_into_its_datagrams():
    """The native client leaves UDP_GRO on: a Python op reading the socket afterwards
    gets each datagram of a batch, in order, then the next one from the other socket."""
    rx, tx = _pair()
    other, tx2 = _pair()
    try:
        try:
            rx.setsockopt(SOL_UDP, UDP_GRO, 1)
            tx.setsockopt(SOL_UDP, UDP_SEGMENT, 100)
        except OSError:
            pytest.skip("this kernel has no UDP_GRO / UDP_SEGMENT")
        parts = [bytes([i]) * 100 for i in range(4)] + [b"\x09" * 37]
        tx.sendto(b"".join(parts), rx.getsockname())
        tx2.sendto(b"last", other.getsockname())
        tx.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
        tx.sendto(b"", rx.getsockname())                        # an empty datagram too
        recv = Receiver(rx, other)
        buf = bytearray(65536)
        got = []
        deadline = time.monotonic() + 5
        while len(got) < len(parts) + 2 and time.monotonic() < deadline:
            try:
                n, src = recv.receive(buf, 0.1)
            except TimeoutError:
                continue
            got.append((bytes(buf[:n]), src))
        datagrams = [data for data, _ in got]
        assert datagrams[:len(parts)] == parts          # whole on the wire or cut here
        assert sorted(datagrams[len(parts):]) == [b"", b"last"]
        assert {src for _, src in got[:len(parts)]} == {tx.getsockname()}
        with pytest.raises(TimeoutError):
            recv.receive(buf, 0.01)
    finally:
        for s in (rx, tx, other, tx2):
            s.close()


@pytest.mark.parametrize("client", ["native", "python"])
def test_closing_with_an_op_in_flight_fails_it_and_stops_the_thread(client):
    """A switch that never answers: close() must stop the I/O thread within a slice (not
    leave it reading sockets the session then closes) and fail the op with a reason."""
    if client == "native" and not available():
        pytest.skip("native library not built")
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    channel = Channel(JobKeys.derive(bytes(32), 7, AUTH_MAC, [0, 1]), 0)
    transport = Transport(sock, 0, 2, 256, [Shard(silent.getsockname(), 7, 4, channel)],
                          Timing(), client=client)
    try:
        fut = transport.submit(Request(torch.ones(100_000)))
        queued = transport.submit(Request(torch.ones(10)))
        time.sleep(0.5)                                  # the op is waiting for the switch
        assert not fut.done()
        t0 = time.monotonic()
        assert transport.close() is True
        assert time.monotonic() - t0 < 2.0
        assert not transport._thread.is_alive()
        for f in (fut, queued):
            with pytest.raises(ExchangeError, match="closed with an all-reduce in flight"):
                f.wait()
        later = transport.submit(Request(torch.ones(10)))
        with pytest.raises(ExchangeError):
            later.wait()
        assert silent.recv(65536, socket.MSG_DONTWAIT)   # it did send
    finally:
        transport.close()
        sock.close()
        silent.close()


@pytest.mark.parametrize("client", ["native", "python"])
def test_a_send_the_kernel_refuses_fails_the_op_with_its_reason(client):
    """A datagram to port 0 is refused by the kernel (EINVAL; nothing is sent): the op
    fails at once with the address and the system's reason (and the transport is broken:
    later ops fail with it too)."""
    if client == "native" and not available():
        pytest.skip("native library not built")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    channel = Channel(JobKeys.derive(bytes(32), 7, AUTH_MAC, [0, 1]), 0)
    transport = Transport(sock, 0, 2, 256, [Shard(("127.0.0.1", 0), 7, 4, channel)],
                          Timing(), client=client)
    try:
        t0 = time.monotonic()
        fut = transport.submit(Request(torch.ones(10_000)))
        with pytest.raises(ExchangeError,
                           match=r"^cannot send to the switch at 127\.0\.0\.1:0: Invalid "
                                 r"argument$"):
            fut.wait()
        assert time.monotonic() - t0 < 5.0
        with pytest.raises(ExchangeError, match="cannot send to the switch"):
            transport.submit(Request(torch.ones(10))).wait()
    finally:
        transport.close()
        sock.close()
