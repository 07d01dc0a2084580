"""Ports for the local services: free ones on 127.0.0.1, never the same twice in one
process, taken from RSIEVE_LOCAL_PORTS when it names a range (a firewall's, or each test
worker's own below the kernel's ephemeral range)."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Sequence

HOST = "127.0.0.1"


def port_is_free(port: int) -> bool:
    """True when a server could listen on 127.0.0.1:``port`` right now."""
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind (Go and Redis set SO_REUSEADDR): a port whose last connections
        # linger in TIME_WAIT after a restart still counts as free; one listened on does not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


_HANDED_OUT: set[int] = set()

# "LOW-HIGH": the ports a local stack takes, where the kernel's ephemeral choice will not
# do (a firewall's range; the test suite's workers, each in a range of its own below the
# ephemeral range, so that a port picked for one stack cannot be picked meanwhile by
# another stack's start or by any outgoing connection).
PORT_RANGE_ENV = "RSIEVE_LOCAL_PORTS"


def port_range() -> range | None:
    """The range named by RSIEVE_LOCAL_PORTS, or None when it is not set."""
    spec = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not spec:
        return None
    low, _, high = spec.partition("-")
    try:
        ports = range(int(low), int(high) + 1)
    except ValueError:
        raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: expected LOW-HIGH, as 20000-20999") from None
    if not 0 < ports.start < ports.stop <= 65536:
        raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: expected 1 <= LOW <= HIGH <= 65535")
    return ports


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now: one of RSIEVE_LOCAL_PORTS when it is set,
    else the kernel's choice of an ephemeral port.

    Never the same port twice in one process, so ``free_port(), free_port()`` are distinct
    even before anything listens on the first.
    """
    ports = port_range()
    if ports is not None:
        first = random.randrange(len(ports))
        for i in range(len(ports)):
            port = ports[(first + i) % len(ports)]
            if port not in _HANDED_OUT and port_is_free(port):
                _HANDED_OUT.add(port)
                return port
        raise RuntimeError(f"no free port left in {PORT_RANGE_ENV}={ports.start}-{ports.stop - 1}")
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no fresh free port on {HOST}")


def free_ports(count: int, *, exclude: Sequence[int] = ()) -> list[int]:
    """``count`` distinct free ports, none of them in ``exclude``."""
    ports: list[int] = []
    taken = set(exclude)
    while len(ports) < count:
        port = free_port()
        if port not in taken:
            taken.add(port)
            ports.append(port)
    return ports


def free_port_with_offset(offset: int, *, exclude: Sequence[int] = ()) -> int:
    """A port ``p`` such that both ``p`` and ``p + offset`` are free (and not excluded)."""
    rng = random.Random()
    taken = set(exclude)
    ports = port_range() or range(20000, 65535 - offset)
    for _ in range(1000):
        port = rng.choice(ports)
        if port in taken or port + offset in taken:
            continue
        if port in _HANDED_OUT or port + offset in _HANDED_OUT:
            continue
        if port_is_free(port) and port_is_free(port + offset):
            _HANDED_OUT.update((port, port + offset))
            return port
    raise RuntimeError(f"no free port pair (p, p+{offset}) found on {HOST}")
