"""Waiting for inference servers to answer GET /health (SGLang's and the built-in server's route).

Torch-free (urllib only). `wait_healthy` is the one wait for servers to start (the launcher and
areal/infra/server_process.py use it); its error names the server and the key that sets the
deadline. Waiting watches the server processes too: a server that exits while starting is
reported at once with its exit code instead of after the whole startup timeout. Once the run is
going, `HealthWatch` keeps probing in a background thread and names any server that stopped
answering (hung, or stopped with SIGSTOP) for launcher.server_health_timeout_s.
"""

from __future__ import annotations

import http.client
import threading
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


class ServerStartupTimeout(ServerStartupError, TimeoutError):
    """A server still running but not answering /health when the deadline passed."""


def is_healthy(addr: str, timeout: float = 2.0, headers: dict[str, str] | None = None) -> bool:
    """One GET http://addr/health; True on 200 (headers: e.g. the bearer key, which SGLang does
    not ask for on /health but a proxy in front of it may).

    Anything but an HTTP answer is False, a malformed one too: before a server listens, a probe of
    a port in the ephemeral range can connect to itself (Linux's TCP simultaneous open, when the
    kernel picks that very port as the probe's source) and read its own request back as the status
    line (BadStatusLine: 'GET /health HTTP/1.1'); this once failed a launch in CI."""
    request = urllib.request.Request(f"http://{addr}/health", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return False


STARTUP_TIMEOUT_KEY = "launcher.server_startup_timeout_s"


def wait_healthy(
    servers: dict[str, str],
    timeout_s: float,
    exit_status: Callable[[str], int | None] | None = None,
    interval: float = 0.5,
    check: Callable[[str, str], bool] | None = None,
    *,
    timeout_key: str = STARTUP_TIMEOUT_KEY,
    headers: dict[str, str] | None = None,
) -> None:
    """Return once every server answers /health; raise ServerStartupError otherwise.

    The one wait for servers to come up (the launcher, the trainer's client, the test helpers).
    `servers` maps a name (a process name, or the address itself) to its host:port. Past
    `timeout_s` it raises ServerStartupTimeout (also a TimeoutError) naming the first server still
    silent, the others, and `timeout_key`, the config key (or argument) that sets the deadline.
    `exit_status(name)` returns the exit code of a server that has exited (None while it runs), so
    a server that dies while starting is reported at once. `check(name, addr)` replaces the HTTP
    probe (the Ray backend probes from the server's own node); `headers` go with the probe.
    """
    probe = check or (lambda _name, addr: is_healthy(addr, headers=headers))
    pending = dict(servers)
    deadline = time.monotonic() + timeout_s
    while pending:
        for name, addr in list(pending.items()):
            code = exit_status(name) if exit_status is not None else None
            if code is not None:
                raise ServerStartupError(name, f"{name} exited with code {code} before it was healthy", code)
            if probe(name, addr):
                del pending[name]
        if not pending:
            return
        if time.monotonic() > deadline:
            (name, addr), others = next(iter(pending.items())), list(pending)[1:]
            also = f"; {', '.join(others)} did not answer either" if others else ""
            raise ServerStartupTimeout(
                name,
                f"{name} did not answer http://{addr}/health within {timeout_s:g} s{also} "
                f"(raise {timeout_key} if the model is slow to load)",
            )
        time.sleep(interval)


class HealthWatch:
    """Probes every server's /health in a background thread while the run goes on.

    servers maps a process name to its host:port; probe(name, addr) -> bool is the check (an
    exception counts as no answer). `silent()` names the first server whose last answer is older
    than timeout_s and that has failed a probe since, with the seconds since its last answer;
    `reset(name)` restarts its clock (after a restart). A failed probe is needed because time
    alone proves nothing when the watcher itself was paused (the launcher SIGSTOPped, the machine
    suspended): scripts/chaos.py found a launcher resumed after 15 s restarting a healthy server.
    """

    def __init__(
        self,
        servers: dict[str, str],
        timeout_s: float,
        probe: Callable[[str, str], bool],
        interval_s: float | None = None,
    ):
        self.servers = dict(servers)
        self.timeout_s = timeout_s
        self.interval_s = interval_s or max(0.5, min(5.0, timeout_s / 4))
        self._probe = probe
        self._lock = threading.Lock()
        self._last_ok = {name: time.monotonic() for name in servers}
        self._failed = {name: False for name in servers}  # a probe failed since the last answer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="health-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            for name, addr in self.servers.items():
                try:
                    ok = self._probe(name, addr)
                except Exception:  # a probe that fails to run is no answer either
                    ok = False
                with self._lock:
                    if ok:
                        self._last_ok[name], self._failed[name] = time.monotonic(), False
                    else:
                        self._failed[name] = True

    def silent(self, after_s: float | None = None) -> tuple[str, float] | None:
        """(name, seconds without an answer) of a server silent for longer than after_s
        (timeout_s where not given)."""
        return next(iter(self.silences(self.timeout_s if after_s is None else after_s).items()), None)

    def silences(self, after_s: float) -> dict[str, float]:
        """{name: seconds without an answer} of the servers silent for longer than after_s (and
        that failed a probe since their last answer)."""
        now = time.monotonic()
        with self._lock:
            return {
                name: now - last for name, last in self._last_ok.items() if now - last > after_s and self._failed[name]
            }

    def failing(self, name: str) -> bool:
        """Whether a probe of this server failed since its last answer."""
        with self._lock:
            return self._failed[name]

    def count_from_now(self) -> None:
        """Count every server's silence from now at the longest (a deadline that begins now),
        keeping whether it has failed a probe since its last answer."""
        now = time.monotonic()
        with self._lock:
            for name in self._last_ok:
                self._last_ok[name] = max(self._last_ok[name], now)

    def reset(self, name: str) -> None:
        with self._lock:
            self._last_ok[name], self._failed[name] = time.monotonic(), False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
