"""The built-in server near and at its limit on open files: connections are descriptors.

Clients may hold more connections than the server takes requests: RemoteSGLangEngine opens one
per request in flight, a request answered 503 keeps its connection, and after a burst the client
keeps them all alive, idle, for reuse. So a server can reach its RLIMIT_NOFILE even when its
start-up check passed (areal.infra.sockets.raise_open_file_limit counts --max-running-requests +
--max-queued-requests). Measured with `scripts/bench_paths.py --server-open-files 1400` (2,048
requests in flight, capacity 1,088): 1,393 of the client's connections sat idle holding the
server's descriptors while 655 requests waited in the listen queue, for 28 s, until the client's
keep-alive timeout closed them; the burst took 36 s instead of 9.

Two things here:

- `close_connections_when_files_run_short` (a response hook): while fewer than SPARE_FILES
  descriptors are left, every response closes its connection (`Connection: close`), so that
  connections are given back as requests finish and the ones waiting in the queue are accepted.
  With room to spare, connections stay alive as usual (closing them would only add reconnects).
- `AcceptGuard` (the loop's exception handler): at the limit itself `accept()` fails with EMFILE
  and asyncio stops accepting for a second, the connections waiting in the kernel's listen queue
  (back-pressure: nothing is reset while the queue, sized to the server's capacity, has room). But
  asyncio (CPython before gh-151615) keeps trying after the first failure, `backlog` times per
  wake-up, and logs each failure with a traceback: a server with a backlog of 1,088 wrote 550,000
  lines (122 MB) in 35 s. The guard says it once every WARN_EVERY_S instead, naming the limit and
  how to raise it, and counts the failures (/server_info load.accept_out_of_files).
"""

from __future__ import annotations

import logging
import os
import resource
import time
from typing import Callable

from areal.infra.sockets import BASE_OPEN_FILES

logger = logging.getLogger("areal.server")

ACCEPT_OUT_OF_RESOURCE = "socket.accept() out of system resource"  # asyncio's message
WARN_EVERY_S = 10.0
SPARE_FILES = BASE_OPEN_FILES  # descriptors kept for what is not a connection (files, pipes, new connections)


def open_files() -> int | None:
    """Descriptors this process holds (/proc/self/fd); None where that cannot be read."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def files_run_short(connections: int) -> bool:
    """Whether `connections` leave fewer than SPARE_FILES descriptors under the soft limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft != resource.RLIM_INFINITY and connections + SPARE_FILES > soft


async def close_connections_when_files_run_short(request, response) -> None:
    """aiohttp on_response_prepare hook: `Connection: close` while descriptors run short."""
    count = request.app["state"].open_connections
    if count is not None and files_run_short(count()):
        response.force_close()
        # aiohttp (3.14) runs this hook after it wrote the Connection header down: without the
        # header the client would reuse the connection the server closes (ServerDisconnectedError)
        response.headers["Connection"] = "close"


class AcceptGuard:
    """A loop exception handler: accept() out of files is counted and warned about at most once
    per `every_s`, naming the limit; anything else goes to the loop's default handler."""

    def __init__(self, backlog: int, on_error: Callable[[], None] | None = None, every_s: float = WARN_EVERY_S):
        self.backlog = backlog
        self.on_error = on_error
        self.every_s = every_s
        self.count = 0
        self._warned_at: float | None = None

    def __call__(self, loop, context: dict) -> None:
        if context.get("message") != ACCEPT_OUT_OF_RESOURCE:
            loop.default_exception_handler(context)
            return
        self.count += 1
        if self.on_error is not None:
            self.on_error()
        now = time.monotonic()
        if self._warned_at is not None and now - self._warned_at < self.every_s:
            return
        self._warned_at = now
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        logger.warning(
            "cannot accept connections: %s (%s open, limit RLIMIT_NOFILE %s, hard %s). New "
            "connections wait in the listen queue (up to %d) until others close; past it the kernel "
            "drops them. The clients hold more connections than this server takes requests "
            "(--max-running-requests + --max-queued-requests): raise the limit (ulimit -n, up to "
            "ulimit -Hn; nofile in /etc/security/limits.conf), or lower the clients' concurrency "
            "(rollout.max_concurrent_rollouts x gconfig.n_samples per server). %d such failures so far; "
            "this is said at most every %.0f s.",
            context.get("exception"),
            _open_files_text(),
            _fmt(soft),
            _fmt(hard),
            self.backlog,
            self.count,
            self.every_s,
        )


def _open_files_text() -> str:
    n = open_files()  # listing /proc/self/fd takes a descriptor itself: at the limit it fails
    return "every descriptor" if n is None else f"{n} files"


def _fmt(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
