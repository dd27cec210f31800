"""Where a job's multicast group reaches its workers (the control plane's rule for granting
one): a pure rule over the workers' addresses, and the one look at this host's routes it
needs (:func:`is_local`)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

__all__ = ["group_reaches", "granted_port", "is_local", "is_loopback"]


def group_reaches(addresses: list[tuple[str, int]], loopback_multicast: bool,
                  is_local_fn: Callable[[str], bool] | None = None) -> bool:
    """Whether results sent to a multicast group reach workers at ``addresses``. A switch on a
    loopback address (``loopback_multicast``) sends its groups through lo: they reach its
    loopback workers and nobody else. A switch elsewhere sends them into the network: they
    reach the workers of other hosts, which join on their interface, but not loopback ones
    nor those on another address of the switch's own host (its groups do not loop back)."""
    local = is_local_fn or is_local
    for host, _ in addresses:
        loopback = is_loopback(host)
        if loopback != loopback_multicast or (not loopback and local(host)):
            return False  # a group through lo reaches loopback workers, and only them
    return True


def granted_port(port: int, addresses: list[tuple[str, int]], loopback_multicast: bool,
                 is_local_fn: Callable[[str], bool] | None = None) -> int | None:
    """The multicast port a job asked for, if its group would reach every worker; else None
    (its results then go to each worker in turn)."""
    return port if group_reaches(addresses, loopback_multicast, is_local_fn) else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 loopback literal (a name is not)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_local(host: str) -> bool:
    """Whether ``host`` is an address of this host: the kernel's route to it starts from
    that very address (connecting a UDP socket sends nothing; a bind test would say yes to
    any address where ``ip_nonlocal_bind`` is set)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
        except OSError:
            return False
        return bool(probe.getsockname()[0] == host)
