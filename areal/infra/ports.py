"""Free TCP ports: for servers, trainer rendezvous and weight-update groups (torch-free).

Every check binds with SO_REUSEADDR, as servers do, so a port left in TIME_WAIT by an earlier run
counts as free. A port found free can still be taken before its user binds it (a short race that
callers handle: the launcher moves past ports in use, servers fail fast with the port named).
"""

from __future__ import annotations

import os
import socket


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the operating system reports free on `host` now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def next_free_port(port: int, avoid: set[int] = frozenset(), limit: int = 65535) -> int | None:
    """`port` itself when free, else the next free port above it that is not in `avoid`; None
    when there is none up to `limit`."""
    for candidate in range(port, limit + 1):
        if candidate not in avoid and port_is_free(candidate):
            return candidate
    return None


def free_port_block(count: int, host: str = "127.0.0.1", start: int = 20000, stop: int = 60000) -> int:
    """A base port such that base .. base+count-1 are free now. The scan starts at a
    pid-dependent offset so concurrent processes rarely pick the same block."""
    for base in range(start + (os.getpid() % 1000) * 10, stop, count + 1):
        if all(port_is_free(base + i, host) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports between {start} and {stop} on {host}")
