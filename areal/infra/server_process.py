"""Starting inference server processes and waiting until they serve: the one way the launcher
(launcher/procs.py), the servers the client starts itself (areal/engine/sglang/local_servers.py),
the tests and the benchmark scripts start `python -m areal.server` or SGLang.

`spawn` starts a process in a session of its own, so a Ctrl-C in the terminal reaches only the
starter, which stops it deliberately, and its whole tree can be signalled through its process
group; Linux kills it when its starter dies without a teardown (`die_with_parent`). Its output
goes to a log file (or a pipe the starter reads). `start_server_process` adds the server's
address and log; `wait_until_serving` is areal.infra.health's wait (the error names the server
and the key that sets the deadline), with the end of the server's log in its error;
`stop_servers` stops several within one grace period. `start_builtin_server` does it all for one
built-in server on a free port.

Torch-free: the standard library and areal.infra only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from areal.infra.health import ServerStartupError, wait_healthy
from areal.infra.ports import free_port

LOG_TAIL_LINES = 30  # of a server's log, in the error when it fails to start


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGKILL the child when its starter (the launcher, a Ray actor,
    a trainer, a test) dies without a teardown (SIGKILL, node loss): its own session would
    otherwise outlive it.

    The signal follows the thread that forked, so it is only set from the main thread; None
    (no preexec_fn) elsewhere and off Linux. Only libc's prctl runs in the child (no imports).
    The launcher's backends start processes from their main thread (a Ray actor without
    max_concurrency runs its methods there). What the children start themselves must end with
    them on its own: reward workers watch their parent (areal/utils/lifetime.py).
    tests/launcher/test_orphans.py SIGKILLs the launcher of a real run and checks that no process
    of the run is left.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def spawn(command: list[str], env: dict[str, str], *, stdout, cwd: str | None = None) -> subprocess.Popen:
    """Start `command` in a session of its own that dies with this process (`die_with_parent`);
    stderr goes with stdout (a file, or subprocess.PIPE), stdin is empty."""
    return subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )


@dataclass
class ServerProcess:
    """A started server: `name` (what errors call it), `addr` (host:port), its process and log."""

    name: str
    addr: str
    proc: subprocess.Popen
    log_path: str

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if not os.path.exists(self.log_path):
            return "(no log)"
        return "\n".join(tail_lines(self.log_path, lines))

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM its process group, SIGKILL after `grace_s`; returns the exit code."""
        stop_servers([self], grace_s)
        return self.proc.returncode


def terminal_lines(text: str) -> list[str]:
    """`text`'s lines as a terminal shows them: a progress bar redraws its line after each carriage
    return, so only what follows the last one is kept (SGLang's 36-step CUDA-graph capture bar is
    one line, not 60)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines]


def tail_lines(path: str, n: int = 20) -> list[str]:
    """The last n lines of a log file as a terminal shows them ([] when it is missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return []
    return terminal_lines(data.decode("utf-8", errors="replace"))[-n:]


def start_server_process(
    command: list[str], *, addr: str, log_path: str | os.PathLike, env: dict[str, str] | None = None, name: str = ""
) -> ServerProcess:
    """`spawn` a server that will listen on `addr`, its output appended to `log_path`."""
    with open(log_path, "ab") as log:
        proc = spawn(command, dict(os.environ) if env is None else env, stdout=log)
    return ServerProcess(name or addr, addr, proc, str(log_path))


def wait_until_serving(
    servers: list[ServerProcess],
    timeout_s: float,
    *,
    timeout_key: str,
    headers: dict[str, str] | None = None,
    interval: float = 0.25,
    kind: str = "",
) -> None:
    """Return once every server answers /health. A server that exits first is reported at once;
    past `timeout_s`, the first still silent (`timeout_key` names what sets the deadline). The
    ServerStartupError says `kind` (e.g. "inference server") and ends with the server's log."""
    by_name = {s.name: s for s in servers}
    try:
        wait_healthy(
            {s.name: s.addr for s in servers},
            timeout_s,
            lambda name: by_name[name].proc.poll(),
            interval,
            timeout_key=timeout_key,
            headers=headers,
        )
    except ServerStartupError as e:
        server = by_name[e.name]
        what = f"{kind} {e}" if kind else str(e)
        message = f"{what}; its log ({server.log_path}) ends with:\n{server.log_tail()}"
        raise type(e)(e.name, message, e.returncode) from None


def stop_servers(servers: list[ServerProcess], grace_s: float) -> None:
    """SIGTERM every server's process group, then SIGKILL those still running `grace_s` later
    (one grace period for all of them)."""
    for server in servers:
        _signal_group(server.proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for server in servers:
        try:
            server.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(server.proc, signal.SIGKILL)
            server.proc.wait(timeout=10)


def start_builtin_server(
    model_path: str | os.PathLike,
    port: int | None = None,
    extra_args=(),
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    log_dir: str | None = None,
) -> ServerProcess:
    """`python -m areal.server --model-path MODEL --port PORT [extra_args]` on 127.0.0.1 (a free
    port unless given), with `env` on top of this process's environment and its output in a new
    log file in `log_dir` (the system's temporary folder unless given), kept after the server
    stops. Returns once /health answers; a server that exits first or is not up within `timeout` s
    is stopped and reported (ServerStartupError, with the end of its log)."""
    port = port or free_port()
    fd, log_path = tempfile.mkstemp(prefix=f"areal-server-{port}-", suffix=".log", dir=log_dir)
    os.close(fd)
    command = [sys.executable, "-m", "areal.server", "--model-path", str(model_path), "--port", str(port)]
    server = start_server_process(
        [*command, *map(str, extra_args)],
        addr=f"127.0.0.1:{port}",
        log_path=log_path,
        env={**os.environ, **(env or {})},
        name="areal.server",
    )
    try:
        wait_until_serving([server], timeout, timeout_key="start_builtin_server(timeout=...)", interval=0.2)
    except BaseException:
        server.stop()
        raise
    return server


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
