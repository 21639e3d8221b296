"""Free TCP ports: for servers, trainer rendezvous and weight-update groups (torch-free).

Every check binds with SO_REUSEADDR, as servers do, so a port left in TIME_WAIT by an earlier run
counts as free. A port found free can still be taken before its user binds it (a short race that
callers handle: the launcher moves past ports in use, servers fail fast with the port named).
Ports are looked for below the kernel's ephemeral range (`listen_range`): there, no outgoing
connection of this machine is given the port between the check and the bind. Inside it, CI saw a
chaos trial's server fail with "address already in use" on a port found free a moment before, and
a launcher's health probe connect to itself (2026-12-05/06).
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

LISTEN_RANGE_START = 20000
LINUX_EPHEMERAL = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux: net.ipv4.ip_local_port_range)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return low, high


def listen_range() -> tuple[int, int]:
    """[start, stop) to look for ports to listen on: from LISTEN_RANGE_START up to the ephemeral
    range, or up to 65536 where that range starts too low to leave 1000 ports below it."""
    low, _ = ephemeral_range()
    return (LISTEN_RANGE_START, low) if low - LISTEN_RANGE_START >= 1000 else (LISTEN_RANGE_START, 65536)


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, drawn at random from `listen_range` (the operating system's
    choice, an ephemeral port, where 200 draws find none)."""
    start, stop = listen_range()
    rng = random.Random()  # unseeded: concurrent processes draw different ports
    for _ in range(200):
        port = rng.randrange(start, stop)
        if port_is_free(port, host):
            return port
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


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """A base port such that base .. base+count-1 are free now, in `listen_range`. The scan starts
    at a pid-dependent offset so concurrent processes rarely pick the same block."""
    start, stop = listen_range()
    offset = (os.getpid() % 1000) * 10 % max(stop - start - count, 1)
    for base in [*range(start + offset, stop - count, count + 1), *range(start, start + offset, count + 1)]:
        if all(port_is_free(base + i, host) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports between {start} and {stop} on {host}")
