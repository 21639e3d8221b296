"""Child processes the launcher owns: start, stream output, and stop whole process trees.

Both backends use this (the Ray backend inside its per-process actor). Each child starts as every
server process does (areal/infra/server_process.py's `spawn`): in its own session, so a Ctrl-C in
the terminal reaches only the launcher, which then stops every child deliberately, and so a whole
tree (a server's scheduler workers, a trainer's dataloader workers) can be signalled through its
process group; and it dies with the launcher when that is killed without a teardown. Stopping also
signals every descendant psutil finds, which catches grandchildren that moved to a process group of
their own.

Torch-free: psutil and the standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, TextIO

import psutil

from areal.infra import ports
from areal.infra.ports import port_is_free  # noqa: F401 (the launcher's tests use it from here)
from areal.infra.server_process import spawn

LAST_GRACE_S = 1.0  # what the rest of a tree gets after SIGTERM when its leader used up the grace

# One lock for every console line, so lines of different processes never interleave mid-line.
_CONSOLE_LOCK = threading.Lock()


class LaunchError(RuntimeError):
    """The launcher cannot go on (no free port, no room on the Ray cluster); the message says
    what and how to fix it. The run exits with code 1 after stopping what it started."""


def exit_code(returncode: int) -> int:
    """A positive exit status for the run: a child killed by signal N reports 128 + N, like a shell."""
    return 128 - returncode if returncode < 0 else returncode


class ManagedProcess:
    """One child process and the thread that copies its output to a log file, a sink and memory.

    `sink(line)` receives each output line (the local backend prints it with a `[name]` prefix;
    the Ray actor queues it for the launcher). The last lines stay in memory for error reports.
    """

    def __init__(
        self,
        name: str,
        command: list[str],
        env: dict[str, str],
        *,
        log_path: str | None = None,
        cwd: str | None = None,
        sink: Callable[[str], None] | None = None,
        keep_lines: int = 200,
    ):
        self.name = name
        self.command = command
        self.log_path = log_path
        self.tail: deque[str] = deque(maxlen=keep_lines)
        self._sink = sink
        self._muted = False
        self._last_output = time.monotonic()
        self._log: TextIO | None = None
        if log_path:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")
            self._log.write(start_banner(name, command) + "\n")
        try:
            self.popen = spawn(command, env, stdout=subprocess.PIPE, cwd=cwd)
        except OSError as e:
            self._close_log()
            raise RuntimeError(f"{name}: cannot start {command[0]!r}: {e}") from e
        self._pump = threading.Thread(target=self._copy_output, name=f"pump-{name}", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def _copy_output(self) -> None:
        assert self.popen.stdout is not None
        for raw in iter(self.popen.stdout.readline, b""):
            self._last_output = time.monotonic()
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.tail.append(line)
            if self._log:
                self._log.write(line + "\n")
            if self._sink and not self._muted:
                self._sink(line)
        self.popen.stdout.close()
        self._close_log()

    def _close_log(self) -> None:
        if self._log:
            self._log.close()
            self._log = None

    def wait_output(self, timeout: float = 5.0, idle_s: float = 0.3) -> None:
        """Let the output thread copy what the process wrote before it exited.

        Ends at end of output, or once no line came for idle_s: a grandchild that inherited the
        pipe keeps it open (no end of output) until the teardown stops it.
        """
        start = time.monotonic()
        while self._pump.is_alive() and time.monotonic() < start + timeout:
            self._pump.join(0.05)
            if time.monotonic() - max(self._last_output, start) > idle_s:
                return

    def reap(self) -> None:
        """Collect the exit status and the last output after the tree was signalled."""
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:  # unkillable (D state): nothing more we can do
            pass
        self.wait_output(timeout=2)

    def mute(self) -> None:
        """Stop echoing output to the sink; the log and the tail still get every line. The lines a
        process prints while the launcher stops it (SGLang reports its subprocesses as crashed with
        exit code -15) are not news to the user."""
        self._muted = True

    def stop(self, grace_s: float, mute: bool = True) -> None:
        stop_all([self], grace_s, mute=mute)


def stop_all(procs: list[ManagedProcess], grace_s: float, mute: bool = True) -> None:
    """Stop several process trees together, so the whole teardown takes one grace period. `mute`:
    what the running ones print meanwhile stays out of their sinks (False where the sink is not
    the console but a queue that feeds the log: the Ray backend's actors)."""
    # An exited child's pid may already belong to another process: search only its group then.
    running = {p.pid: p.poll() is None for p in procs}
    for p in procs:
        if running[p.pid] and mute:
            p.mute()
    kill_trees(
        [pid for pid, up in running.items() if up], grace_s, exited=[pid for pid, up in running.items() if not up]
    )
    for p in procs:
        p.reap()


def start_banner(name: str, command: list[str]) -> str:
    """First log line of each start: a log that is appended to across restarts stays readable."""
    return f"=== {name} started {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(command)}"


def console_sink(prefix: str, stream: TextIO | None = None) -> Callable[[str], None]:
    """Print lines as `[prefix] line` (the live, role-prefixed view of the run)."""

    def sink(line: str) -> None:
        out = stream or sys.stdout
        with _CONSOLE_LOCK:
            out.write(f"[{prefix}] {line}\n")
            out.flush()

    return sink


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _group_members(pgid: int) -> list[psutil.Process]:
    """Processes still in a process group (orphans whose parent already exited included)."""
    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                members.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def _tree(pid: int, alive: bool = True) -> dict[int, psutil.Process]:
    """pid, its descendants, and what is left in its process group (orphans whose parent exited).

    alive=False: the leader has exited and been reaped; only its process group is searched.
    """
    procs = {p.pid: p for p in _group_members(pid)}
    if alive:
        procs.update({p.pid: p for p in _descendants(pid)})
        try:
            procs[pid] = psutil.Process(pid)
        except psutil.NoSuchProcess:
            pass
    return procs


def kill_trees(pids: list[int], grace_s: float, exited: list[int] = ()) -> None:
    """SIGTERM each pid (session leaders started by ManagedProcess), then, once the leaders are gone
    or grace_s has passed, what is left of their trees; SIGKILL whatever still runs after that.

    The leaders go first because a server stops its own subprocesses: SGLang's HTTP process tells
    its schedulers to shut down and stops watching them, while a scheduler signalled beside it dies
    first and is reported as crashed. `exited` are leaders that already exited: their process
    groups may still hold orphans. Trees are listed before signalling, because a dying parent's
    children get re-parented and would drop out of the tree; the process group is searched too,
    for orphans already gone.
    """
    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        procs.update(_tree(pid))
    for pid in exited:
        procs.update(_tree(pid, alive=False))
    if not procs:
        return
    deadline = time.monotonic() + grace_s
    leaders = [procs[pid] for pid in pids if pid in procs]
    _signal_all(leaders, signal.SIGTERM)
    _signal_all(leaders, signal.SIGCONT)  # a stopped (SIGSTOP) process acts on SIGTERM only then
    _wait_dead(leaders, timeout=grace_s)
    rest = [p for p in procs.values() if _running(p)]
    _signal_all(rest, signal.SIGTERM)
    _signal_all(rest, signal.SIGCONT)
    alive = _wait_dead(rest, timeout=max(deadline - time.monotonic(), LAST_GRACE_S))
    seen = {a.pid for a in alive}
    for pid in list(pids) + list(exited):  # anything forked during the grace period
        for p in _tree(pid, alive=pid in pids).values():
            if p.pid not in seen:
                alive.append(p)
    _signal_all(alive, signal.SIGKILL)
    _wait_dead(alive, timeout=5)


def _wait_dead(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process is gone or a zombie; returns those still running.

    A zombie is dead, only not yet reaped by its parent (in a container whose init does not reap,
    orphaned zombies linger), so it does not hold up the teardown."""
    deadline = time.monotonic() + timeout
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        psutil.wait_procs(pending, timeout=0.05)  # reaps our own children
        pending = [p for p in pending if _running(p)]
    return pending


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal_all(procs, sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


RUN_MARKER = "AREAL_CONFIG"  # every planned process, and what it starts, has RUN/config.yaml here


def run_processes(config_path: str | os.PathLike, exclude: tuple[int, ...] = ()) -> list[psutil.Process]:
    """The processes of one run on this machine, whatever started them: every process whose
    environment has AREAL_CONFIG=config_path (the plan sets it for servers, trainers and the
    driver; their children inherit it). Zombies (dead, not yet reaped) are left out."""
    want = str(config_path)
    found = []
    for p in psutil.process_iter():
        if p.pid in exclude or p.pid == os.getpid():
            continue
        try:
            if p.environ().get(RUN_MARKER) == want and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):  # gone meanwhile, or not ours to read
            continue
    return found


def next_free_port(port: int, avoid: set[int] = frozenset(), limit: int = 65535) -> int:
    """`port` itself when free, else the next free port above it that is not in `avoid`."""
    found = ports.next_free_port(port, avoid, limit)
    if found is None:
        raise LaunchError(
            f"no free TCP port in [{port}, {limit}]: stop other servers or change "
            "launcher.server_base_port / launcher.trainer_master_port"
        )
    return found


def cpu_threads_per_process(n_processes: int, cores: int | None = None) -> int:
    """OMP_NUM_THREADS for CPU runs: share the cores out so processes do not oversubscribe them."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(1, n_processes))


def with_port(command: list[str], port: int) -> list[str]:
    """The server command with its `--port` value replaced (appended when it has none)."""
    return with_flag(command, "--port", str(port))


def with_flag(command: list[str], flag: str, value: str) -> list[str]:
    """The command with `flag`'s value replaced (flag and value appended when it has none)."""
    if flag in command:
        i = command.index(flag)
        return [*command[: i + 1], value, *command[i + 2 :]]
    return [*command, flag, value]


def advertised_host(command: list[str], node_ip: str = "127.0.0.1") -> str:
    """The host clients use for a server: its --host, or node_ip when it binds every interface."""
    host = command[command.index("--host") + 1] if "--host" in command[:-1] else "127.0.0.1"
    return node_ip if host in ("0.0.0.0", "::", "") else host


def child_env(
    spec_env: dict[str, str],
    extra: dict[str, str],
    *,
    cpu: bool,
    procs_on_node: int,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one child: ours, then the plan's, then the backend's additions.

    OMP_NUM_THREADS, unless the user set it (in the launcher's environment or the config's *_env):
    on CPU, this node's cores shared among its processes; on GPU, 1 (as torchrun does). A GPU
    process's CPU tensor work is small (batch assembly, padding), and with the default of one
    thread per core, OpenMP workers spin after each such op and slow the training thread
    (measured: docs/benchmarks.md, section 4, OpenMP threads).
    """
    env = {**(os.environ if base is None else base), **spec_env, **extra}
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(cpu_threads_per_process(procs_on_node)) if cpu else "1"
    return env
