"""The switch exchanges' specs, parsed and checked before any socket is opened.

    switch:addr=HOST:PORT[+HOST:PORT...],fp=SHA256[+SHA256...],token_file=PATH,
           auth=authenticated|encrypted|none,k=15872,window=8,timeout_ms=200,deadline_s=30,
           drop=0,seed=0,multicast=auto|off,client=native|python,mtu=N
    sparse-switch:block=256,threshold=0,...   only the blocks that carry data (OmniReduce)
    auto:block=256,threshold=0,...            dense or sparse per tensor, from its density

``sparse-switch`` and ``auto`` use k = the largest multiple of the block size <= 16,000
(15,872 for 256), which is also the dense default, so that with threshold 0 all three give
bit-identical sums. Several addresses shard the job: chunks alternate over the switches.
Without ``addr``, ``$DLCOMM_SWITCH`` names the switch (dlcomm's launchers fill in ``addr``
when they start one for the job). ``fp`` pins each switch's TLS certificate (the fingerprint
``dlcomm switch serve`` prints; ``$DLCOMM_SWITCH_FP``); ``token_file`` holds the admin token
a switch beyond loopback requires (``$DLCOMM_SWITCH_TOKEN_FILE``); ``auth`` is the packets'
protection (docs/security.md): a tag on every packet (the default), encrypted payloads too,
or none (a trusted network only). ``client`` is the worker's data path (dense rounds, and
sparse ones at threshold 0): the native one (dlcomm.native.client; the default,
``$DLCOMM_CLIENT``) or its Python specification (sparse rounds with a threshold always run
in Python). ``mtu`` sizes packets to the path (one lost frame then costs one packet, not a
datagram of many IP fragments): k is the largest multiple of the block size (256 in dense
mode, so that all three modes still give the same sums) whose datagram fits one frame;
dlcomm's emulated clusters tell their workers their MTU (``$DLCOMM_PATH_MTU``), which is
then the default of ``switch`` (dense rounds, native); ``sparse-switch`` and ``auto`` keep
64 KB datagrams unless given ``mtu``, because a sparse round carries a look-ahead and up to
m blocks, and fewer, fuller rounds cost less per byte. ``mtu=0``: datagrams up to 64 KB.
``multicast=off``: results to every worker in turn, never to the job's group (bootstrap.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dlcomm.errors import ConfigError
from dlcomm.exchange.switch.window import Timing
from dlcomm.registry import reject_unknown, take_option
from dlcomm.switch.client import Address, parse_addresses
from dlcomm.wire.auth import AUTH_MODES
from dlcomm.wire.packet import max_elements

__all__ = ["SwitchSpec", "parse_switch_spec", "SWITCH_ENV", "FP_ENV", "TOKEN_ENV", "CLIENT_ENV",
           "MTU_ENV", "k_for_mtu", "MAX_K", "DEFAULT_BLOCK", "DEFAULT_K", "DEFAULT_WINDOW", "MODES"]

SWITCH_ENV = "DLCOMM_SWITCH"  # set by dlcomm's launchers when they start the switch
FP_ENV = "DLCOMM_SWITCH_FP"
TOKEN_ENV = "DLCOMM_SWITCH_TOKEN_FILE"
CLIENT_ENV = "DLCOMM_CLIENT"
MTU_ENV = "DLCOMM_PATH_MTU"
FRAME_OVERHEAD = 20 + 8 + 32 + 16   # IPv4, UDP, dlcomm's header and tag
MAX_K = 16000  # 64,032-byte datagrams: near the UDP maximum, few per-packet costs
DEFAULT_BLOCK = 256
DEFAULT_K = MAX_K // DEFAULT_BLOCK * DEFAULT_BLOCK  # 15,872: dense chunks = sparse groups
DEFAULT_WINDOW = 8  # per shard at the default k (more for smaller packets: the same bytes)
MODES = {"dense": "switch", "sparse": "sparse-switch", "auto": "auto"}  # mode -> spec name


@dataclass(frozen=True)
class SwitchSpec:
    """Everything a switch exchange needs to know, checked."""

    mode: str                                  # dense | sparse | auto
    addresses: tuple[Address, ...]
    k: int = DEFAULT_K                         # elements per packet
    window: int = DEFAULT_WINDOW               # slots per shard
    timing: Timing = field(default_factory=Timing)
    drop_rate: float = 0.0                     # injected loss, both directions
    seed: int = 0
    multicast: bool = True                     # results by IP multicast where possible
    block: int = 0                             # sparse block size (0 in dense mode)
    threshold: float = 0.0                     # sparse: blocks at or below are not sent
    fingerprints: tuple[str, ...] = ()         # per address: its TLS certificate's sha256
    token_file: str | None = None              # the switch's admin token, if it needs one
    auth: str = "authenticated"                # authenticated | encrypted | none
    client: str = "native"                     # dense rounds: native | python

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"switch mode must be dense, sparse or auto, got {self.mode!r}")
        if not self.addresses:
            raise ConfigError("the switch exchange needs addr=HOST:PORT (or --switch)")
        if not 1 <= self.k <= max_elements():
            raise ConfigError(f"switch k must be in 1..{max_elements()}, got {self.k}")
        if self.window < 1:
            raise ConfigError(f"switch window must be >= 1, got {self.window}")
        if not 0 <= self.drop_rate < 1:
            raise ConfigError(f"switch drop rate must be in [0, 1), got {self.drop_rate}")
        if self.mode != "dense" and (self.block < 1 or self.k % self.block):
            raise ConfigError(f"sparse block size {self.block} must divide k = {self.k}")
        if self.threshold < 0:
            raise ConfigError(f"sparse threshold must be >= 0, got {self.threshold}")
        if len(self.fingerprints) != len(self.addresses):
            raise ConfigError(f"the switch exchange needs fp=SHA256 for each of its "
                              f"{len(self.addresses)} switch(es) (printed by `dlcomm switch "
                              f"serve`; or ${FP_ENV}), got {len(self.fingerprints)}")
        if any(len(f) != 64 or set(f) - set("0123456789abcdef") for f in self.fingerprints):
            raise ConfigError("fp must be a sha256 fingerprint: 64 hex digits")
        if self.auth not in AUTH_MODES:
            raise ConfigError(f"auth must be one of {', '.join(AUTH_MODES)}, got {self.auth!r}")
        if self.client not in ("native", "python"):
            raise ConfigError(f"client must be native or python, got {self.client!r}")

    @property
    def name(self) -> str:
        return MODES[self.mode]


def k_for_mtu(mtu: int, block: int) -> int:
    """The largest multiple of ``block`` elements whose datagram fits a frame of ``mtu``."""
    if mtu < FRAME_OVERHEAD + 4 * block:
        raise ConfigError(f"an MTU of {mtu} cannot carry a block of {block} elements "
                          f"({FRAME_OVERHEAD + 4 * block} bytes)")
    return (mtu - FRAME_OVERHEAD) // 4 // block * block


def parse_switch_spec(mode: str, options: dict[str, str]) -> SwitchSpec:
    """The spec of exchange ``MODES[mode]`` from its ``key=value`` options."""
    name = MODES[mode]
    owner = f"exchange {name!r}"
    opts = dict(options)
    addr_text = opts.pop("addr", None) or os.environ.get(SWITCH_ENV)
    if not addr_text:
        raise ConfigError(f"exchange {name!r} needs addr=HOST:PORT (or let dlcomm start the "
                          f"switch: dlcomm train/bench --exchange {name})")
    timing = Timing(
        initial_timeout_s=take_option(opts, "timeout_ms", float, 200.0, owner) / 1000,
        deadline_s=take_option(opts, "deadline_s", float, 30.0, owner))
    block = take_option(opts, "block", int, DEFAULT_BLOCK, owner) if mode != "dense" else 0
    if mode != "dense" and not 32 <= block <= 1024:
        raise ConfigError(f"{owner}: block must be in 32..1024, got {block}")
    # the path's MTU is the dense default only: sparse rounds run in Python at both ends,
    # where the cost per datagram, not per byte, sets the pace (docs/native.md)
    path_mtu = int(os.environ.get(MTU_ENV) or 0) if mode == "dense" else 0
    mtu = take_option(opts, "mtu", int, path_mtu, owner)
    default_k = MAX_K // block * block if block else DEFAULT_K
    if mtu:
        default_k = min(default_k, k_for_mtu(mtu, block or DEFAULT_BLOCK))
    k = take_option(opts, "k", int, default_k, owner)
    # as many bytes in flight as the default window of 64 KB datagrams, whatever k
    in_flight = -(-DEFAULT_WINDOW * DEFAULT_K // max(k, 1))
    window = take_option(opts, "window", int, min(256, max(DEFAULT_WINDOW, in_flight)), owner)
    drop = take_option(opts, "drop", float, 0.0, owner)
    seed = take_option(opts, "seed", int, 0, owner)
    threshold = take_option(opts, "threshold", float, 0.0, owner) if mode != "dense" else 0.0
    multicast = opts.pop("multicast", "auto")
    if multicast not in ("auto", "off"):
        raise ConfigError(f"{owner}: multicast must be auto or off, got {multicast!r}")
    fp_text = opts.pop("fp", None) or os.environ.get(FP_ENV, "")
    fingerprints = tuple(f.strip().lower() for f in fp_text.replace(",", "+").split("+")
                         if f.strip())
    token_file = opts.pop("token_file", None) or os.environ.get(TOKEN_ENV) or None
    auth = opts.pop("auth", "authenticated")
    client = opts.pop("client", None) or os.environ.get(CLIENT_ENV, "native")
    reject_unknown(opts, owner)
    return SwitchSpec(mode, tuple(parse_addresses(addr_text)), k, window, timing, drop, seed,
                      multicast == "auto", block, threshold, fingerprints, token_file, auth,
                      client)
