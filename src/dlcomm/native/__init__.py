"""dlcomm's native data path: C11 code compiled when dlcomm is installed (``csrc/``; setup.py),
reached through ctypes, which releases the GIL for every call into it.

- :mod:`.lib`: the library and its function signatures (:func:`load`);
- :mod:`.switch`: the switch's dataplane and packet loop (threads, recvmmsg/sendmmsg, UDP GRO);
- :mod:`.loadgen`: a load generator that plays n workers (``dlcomm bench switch``);
- :mod:`.client`: the worker's transport (quantize, send, receive, dequantize; one call).

The Python modules are the specification: the switch dataplane of
:mod:`dlcomm.switch.dataplane` and the client window of :mod:`dlcomm.exchange.switch.window`;
tests/native/ drives both with the same packets and requires the same bytes out.
"""

from dlcomm.native.lib import NativeMissing, available, load

__all__ = ["NativeMissing", "available", "load"]
