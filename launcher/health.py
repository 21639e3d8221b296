"""Waiting for inference servers to answer GET /health (SGLang's and the built-in server's route).

Torch-free (urllib only). Waiting watches the server processes too: a server that exits while
starting is reported at once with its exit code instead of after the whole startup timeout.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Callable


class ServerStartupError(RuntimeError):
    """A server died or stayed unhealthy while starting; `name` says which one."""

    def __init__(self, name: str, message: str, returncode: int | None = None):
        super().__init__(message)
        self.name = name
        self.returncode = returncode


def is_healthy(addr: str, timeout: float = 2.0) -> bool:
    """One GET http://addr/health; True on 200."""
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(servers: dict[str, str], timeout_s: float,
                 exit_status: Callable[[str], int | None], interval: float = 0.5,
                 check: Callable[[str, str], bool] | None = None) -> None:
    """Return once every server answers /health; raise ServerStartupError otherwise.

    servers maps a process name to its host:port; exit_status(name) returns the exit code of a
    server that has exited (None while it runs). check(name, addr) replaces the HTTP probe (the
    Ray backend probes from the server's own node).
    """
    probe = check or (lambda _name, addr: is_healthy(addr))
    pending = dict(servers)
    deadline = time.monotonic() + timeout_s
    while pending:
        for name, addr in list(pending.items()):
            code = exit_status(name)
            if code is not None:
                raise ServerStartupError(name, f"{name} exited with code {code} before it was healthy", code)
            if probe(name, addr):
                del pending[name]
        if not pending:
            return
        if time.monotonic() > deadline:
            name, addr = next(iter(pending.items()))
            raise ServerStartupError(
                name, f"{name} did not answer http://{addr}/health within {timeout_s:g} s "
                "(raise launcher.server_startup_timeout_s if the model is slow to load)")
        time.sleep(interval)
