"""One run of a LaunchPlan, whichever backend runs it: the sequence and the failure handling.

Order: servers start first (each on its planned port, or the next free one), the launcher waits
for their /health and records their addresses (the run's name record and AREAL_SERVER_ADDRS),
then the trainer workers (or, inference-only, the rollout driver) start.

The run succeeds when every trainer (or the driver) exits 0. The first process to fail decides
the exit code (of several found dead in one poll, one killed by a signal: `cause_first`); then,
as on Ctrl-C or SIGTERM, every process tree is stopped (SIGTERM, SIGKILL after
launcher.shutdown_grace_s), so no orphan outlives the launcher. A server that stops
answering /health for launcher.server_health_timeout_s (launcher.server_startup_timeout_s, where
longer, until a trainer rank begins its first step: `Supervisor.silence_limit`, or while it compiles
kernels: `Supervisor.compile_limit`) counts as failed too, and so does any
process left in the stopped state (SIGSTOP) for launcher.stopped_timeout_s: a stopped trainer
rank would otherwise hang the run silently, its peers waiting for it in a collective (those fail
by themselves after actor.collective_timeout_s, and the error then names that key), and so does
a trainer rank left in one phase of a step for launcher.trainer_phase_timeout_s (phase_watch.py:
a rank blocked without being stopped, which no peer may be waiting for). With
launcher.restart_failed_servers a failed server is restarted instead, with the trainer's current
weights (see `Supervisor.restart_server`).

`Supervisor` holds that sequence; a backend (launcher/local.py, launcher/ray.py) subclasses it and
only says how processes are started, watched and stopped.
"""

from __future__ import annotations

import abc
import dataclasses
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from areal.config import ExperimentConfig
from areal.infra.discovery import (
    ENV_VAR,
    clear_served_weights,
    clear_server_addrs,
    read_served_weights,
    record_root_of,
    write_server_addrs,
)
from areal.infra.health import HealthWatch, ServerStartupError, is_healthy, wait_healthy
from areal.infra.server_process import tail_lines

from .diagnosis import hints
from .phase_watch import PhaseWatch, any_phase_since, phase_stamps
from .plan import LaunchPlan, ProcessSpec
from .procs import LaunchError, exit_code, with_flag

POLL_S = 0.2
TAIL_LINES = 30
MAX_SERVER_RESTARTS = 3  # per server and run, with launcher.restart_failed_servers
STOPPED_CHECK_S = 1.0  # launcher.stopped_timeout_s is seconds or more: a 1 s delay is noise
COMPILE_GAP_S = 10.0  # a compiler seen this recently in a server's tree still counts (compiler_seen)
STALL_NOTICE_S = 30.0  # a server silent this long on /health is named on the console (note_stalls)
# What a silent server is likely doing, by server program: SGLang's /health generates one token,
# so it fails while the scheduler produces nothing, e.g. while it compiles the kernels of a new kind
# of batch. On one H200 (2026-12-05) flashinfer built its sampling module for 94 s the first time a
# batch mixed greedy (evaluation) and sampled (training) requests, the scheduler silent throughout;
# flashinfer-jit-cache ships those kernels built (docs/reliability.md).
STALL_CAUSES = {
    "sglang": "its scheduler has produced no output (it compiles kernels for a new kind of batch, "
    "e.g. flashinfer's sampler, 1-2 minutes the first time a batch mixes greedy and sampled requests, "
    "longer on a GPU shared with other runs; the flashinfer-jit-cache package ships them built; "
    "a hang looks the same); ",
}


@dataclasses.dataclass(frozen=True)
class SilenceLimit:
    """How long a server may leave /health unanswered now, and the setting that says so."""

    seconds: float
    setting: str  # the config key
    why: str = ""

    @property
    def key(self) -> str:
        """As the console names it: "launcher.server_health_timeout_s=300"."""
        return f"{self.setting}={self.seconds:g}{self.why}"


def health_limit(watch: HealthWatch) -> SilenceLimit:
    """The limit once the run is under way: launcher.server_health_timeout_s."""
    return SilenceLimit(watch.timeout_s, "launcher.server_health_timeout_s")


class MainExited(Exception):
    """A trainer (or the driver) exited while the servers it was started with still started."""

    def __init__(self, name: str, returncode: int):
        super().__init__(name)
        self.name, self.returncode = name, returncode


class Stopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM reached the launcher; the run stops with 128 + signal.

    A KeyboardInterrupt so that no `except Exception` on the way swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def say(msg: str, stream=None) -> None:
    """A line from the launcher itself, prefixed like the processes' lines."""
    print(f"[launcher] {msg}", file=stream or sys.stdout, flush=True)


@contextmanager
def launcher_signals():
    """SIGINT/SIGTERM raise Stopped until the caller calls the yielded `defer()`; after that they
    only print a note, so a second Ctrl-C cannot abort the teardown half-way (leaving orphans).

    Handlers can only be set in the main thread; elsewhere (embedding, some tests) this is a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return

    def raise_stopped(signum, _frame):
        raise Stopped(signum)

    def note(_signum, _frame):
        say("already stopping every process; please wait", sys.stderr)

    def defer():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, note)

    old = {s: signal.signal(s, raise_stopped) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield defer
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name} (exit code {exit_code(returncode)})"
    if returncode == 0:
        return "exited with code 0 while the run still needed it"
    return f"exited with code {returncode}"


def cause_first(exits: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Exits found in one poll, the likely cause first: clean exits, then deaths by a signal, then
    error exits. A trainer rank killed by a signal breaks its peers' collective, and they exit
    with an error within milliseconds, often inside the same POLL_S; nobody else sends signals
    before the launcher acts, so the signalled process is the cause (kept in start order)."""
    return sorted(exits, key=lambda e: 0 if e[1] == 0 else 1 if e[1] < 0 else 2)


def failure_report(name: str, log_path: str | None, reason: str) -> str:
    """The error the user sees: which process, why, its log and the log's last lines, then a hint
    for each known cause found in them (launcher/diagnosis.py)."""
    lines = [f"error: {name} {reason}" + (f"; log: {log_path}" if log_path else "")]
    tail = tail_lines(log_path, TAIL_LINES) if log_path else []
    if tail:
        lines += [f"--- last {len(tail)} lines of {log_path} ---", *tail, "---", *hints(tail)]
    return "\n".join(lines)


def _tree(pid: int) -> list:
    """pid's process and its descendants (psutil.Process), [] once it is gone."""
    import psutil

    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return []


def stopped_in_tree(pid: int) -> str | None:
    """None while no process of pid's tree is in the stopped state ('T': SIGSTOP, SIGTSTP), '' when
    pid itself is, else the stopped descendant as "pid N (NAME)". The tree counts because a stopped
    subprocess holds its parent up as surely: SGLang's HTTP process keeps answering while its
    stopped scheduler generates nothing, and a trainer waits for its stopped episode worker.

    A debugger's tracing stop ('t', gdb or py-spy attached) does not count."""
    import psutil

    for p in _tree(pid):
        try:
            if p.status() == psutil.STATUS_STOPPED:
                return "" if p.pid == pid else f"pid {p.pid} ({p.name()})"
        except psutil.Error:
            continue
    return None


# Programs of a kernel build: flashinfer and tvm-ffi (SGLang's JIT kernels) run ninja, which runs
# nvcc (cicc, ptxas, fatbinary) and the host compiler; Triton runs ptxas.
COMPILERS = frozenset({"ninja", "nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "cudafe++", "cc1plus", "c++", "g++"})


def compiler_in_tree(pid: int) -> str | None:
    """A compiler (COMPILERS) among pid's descendants as "pid N (NAME)", else None: a server whose
    scheduler builds kernels answers nothing meanwhile, and is not hung."""
    import psutil

    for p in _tree(pid)[1:]:
        try:
            if p.name() in COMPILERS:
                return f"pid {p.pid} ({p.name()})"
        except psutil.Error:
            continue
    return None


STOPPED_ADVICE = "; to pause a run on purpose for longer, raise launcher.stopped_timeout_s (null disables it)"


def stopped_reason(member: str, seconds: float, timeout: float) -> str:
    """'has been in the stopped state (SIGSTOP) for 12 s (launcher.stopped_timeout_s=10)', or 'has
    had its process pid N (NAME) in ...' where a process of its tree is (stopped_in_tree)."""
    who = f"has had its process {member} " if member else "has been "
    return f"{who}in the stopped state (SIGSTOP) for {seconds:.0f} s (launcher.stopped_timeout_s={timeout:g})"


def is_stopped(pid: int) -> bool:
    """Whether a process, or a process of its tree, is in the stopped state (stopped_in_tree)."""
    return stopped_in_tree(pid) is not None


class TreeCheck:
    """check(pid) (stopped_in_tree, compiler_in_tree), asked again for a pid at most every
    STOPPED_CHECK_S: it lists every process of the machine to find the tree, and the monitor polls
    every POLL_S."""

    def __init__(self, check: Callable[[int], str | None] = stopped_in_tree):
        self._check = check
        self._last: dict[int, tuple[float, str | None]] = {}

    def __call__(self, pid: int) -> str | None:
        now = time.monotonic()
        at, found = self._last.get(pid, (float("-inf"), None))
        if now - at >= STOPPED_CHECK_S:
            found = self._check(pid)
            self._last[pid] = (now, found)
        return found


def log_path(plan: LaunchPlan, spec: ProcessSpec) -> str:
    return str(Path(plan.run_dir) / "logs" / f"{spec.name}.log")


class Supervisor(abc.ABC):
    """One run: start servers, publish them, start the main processes, watch, tear down.

    Subclasses say how: `prepare`, `start`, `server_addrs`, `probe`, `refresh`, `teardown`.
    `self.procs` maps process names, in start order, to handles with `poll()` (exit status or
    None), `log_path` and `wait_output()`.
    """

    def __init__(self, plan: LaunchPlan, cfg: ExperimentConfig):
        self.plan = plan
        self.cfg = cfg
        self.procs: dict = {}
        self.holding = False  # keep_servers: servers stay up until Ctrl-C, which then is success
        self.failed_code = 1
        self.addrs: dict[str, str] = {}  # server name -> host:port, once started
        self.restarts: dict[str, int] = {}

    # -- hooks --------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Settle ports and placeholders before anything starts."""
        return None

    @abc.abstractmethod
    def start(self, spec: ProcessSpec, extra: dict[str, str]):
        """Start one process with extra environment; record its handle in self.procs."""

    @abc.abstractmethod
    def server_addrs(self, servers: list[ProcessSpec]) -> dict[str, str]:
        """host:port by server name, as clients will reach them."""

    def probe(self, name: str, addr: str) -> bool | None:
        """Health check of one server; None means: use an HTTP GET from here."""
        return None

    def refresh(self) -> None:
        """Update what poll() returns (the Ray backend fetches output and status here)."""
        return None

    def stopped(self, name: str) -> str | None:
        """As of the last refresh(): None unless the process or one of its tree is in the stopped
        state (SIGSTOP); '' for the process itself, else which one (stopped_in_tree)."""
        return None

    def is_stopped(self, name: str) -> bool:
        return self.stopped(name) is not None

    def compiling(self, name: str) -> str | None:
        """Which compiler runs in the process's tree, if one does (compiler_in_tree)."""
        return None

    def publish(self, addrs: list[str]) -> str:
        return str(write_server_addrs(record_root_of(self.cfg), addrs))

    @abc.abstractmethod
    def teardown(self) -> None:
        """Stop every process started (running or not: orphans of exited ones too)."""

    # -- the sequence -------------------------------------------------------------------------

    def execute(self) -> int:
        code = 1
        with launcher_signals() as defer:
            try:
                code = self.run()
            except LaunchError as e:
                print(f"error: {e}", file=sys.stderr, flush=True)
                code = 1
            except Stopped as s:
                if self.holding:
                    say("stopping the servers")
                    code = 0
                else:
                    say(f"{s} received: stopping every process", sys.stderr)
                    code = 128 + s.signum
            finally:
                defer()
                self.teardown()
        return code

    def run(self) -> int:
        self.prepare()
        mains = [p for p in self.plan.processes if p.role != "server"]
        early = mains if self.plan.mains_start_with_servers else []
        addrs = self.start_servers(early)
        if addrs is None:
            return self.failed_code
        extra = {ENV_VAR: ",".join(addrs)} if addrs else {}
        for spec in mains:
            if spec not in early:
                self.start(spec, extra)
        code = self.monitor([s.name for s in mains])
        if code:
            return code
        say("the " + ("trainers" if mains[0].role == "trainer" else "driver") + " finished successfully")
        if self.cfg.launcher.keep_servers and self.cfg.launcher.trainer_n_nodes == 0 and addrs:
            return self.hold_servers(addrs)
        return 0

    def start_servers(self, mains: list[ProcessSpec]) -> list[str] | None:
        """Start the servers, then `mains` with their addresses (their start-up overlaps the
        servers'; their clients wait for /health), wait for /health and publish the addresses.

        Returns the addresses ([] when the plan has no servers: then rollout.server_addrs, if
        given, is passed on), or None when a server, or one of `mains`, failed meanwhile
        (self.failed_code says how).
        """
        servers = self.plan.by_role("server")
        if not servers:
            return list(self.cfg.rollout.server_addrs)
        clear_server_addrs(record_root_of(self.cfg))
        clear_served_weights(record_root_of(self.cfg))
        for s in servers:
            self.start(s, {})
        self.addrs = self.server_addrs(servers)
        for spec in mains:
            self.start(spec, {ENV_VAR: ",".join(self.addrs.values())})
        if not self.await_health(self.addrs, [m.name for m in mains]):
            return None
        where = self.publish(list(self.addrs.values()))
        say(f"servers ready: {', '.join(self.addrs.values())} (recorded in {where})")
        return list(self.addrs.values())

    def await_health(self, addrs: dict[str, str], mains: list[str] = ()) -> bool:
        """Wait for /health of these servers; on failure report it (self.failed_code) and say
        False. A process of `mains` (started already) that exits meanwhile is the failure."""
        timeout = self.cfg.launcher.server_startup_timeout_s
        say(f"waiting up to {timeout:g} s for {', '.join(addrs)} to answer /health")
        stopped_since: dict[str, float] = {}

        def check(name: str, addr: str) -> bool:
            if self._check(name, addr):
                return True
            self.fail_if_stopped_while_starting(name, stopped_since)
            self.fail_if_a_main_exited(mains)
            return False

        try:
            wait_healthy(addrs, timeout, self._exit_status, check=check)
        except MainExited as e:
            what = describe_exit(e.returncode) if e.returncode else "exited with code 0"
            self.fail(e.name, exit_code(e.returncode) or 1, what + " before the servers answered /health")
            return False
        except ServerStartupError as e:
            if e.returncode is None:  # still running, never healthy
                self.fail(e.name, 1, str(e).removeprefix(e.name + " "))
            else:
                self.fail(e.name, exit_code(e.returncode) or 1, describe_exit(e.returncode) + " before it was healthy")
            return False
        return True

    def fail_if_a_main_exited(self, mains: list[str]) -> None:
        """Raises MainExited for the first of `mains` that has exited (as of the last refresh):
        before the servers answer, no trainer has reason to end, even with status 0."""
        for name in mains:
            code = self.procs[name].poll()
            if code is not None:
                raise MainExited(name, code)

    def fail_if_stopped_while_starting(self, name: str, since: dict[str, float]) -> None:
        """launcher.stopped_timeout_s for a server that has not answered yet: a server (or its
        scheduler) stopped while it starts would otherwise hold the run for the whole
        launcher.server_startup_timeout_s. Raises ServerStartupError naming it."""
        stopped = self.stopped_too_long(name, since)
        if stopped:
            raise ServerStartupError(name, f"{name} {stopped} before it answered /health" + STOPPED_ADVICE)

    def stopped_too_long(self, name: str, since: dict[str, float]) -> str | None:
        """stopped_reason once the process (or one of its tree) has been in the stopped state for
        longer than launcher.stopped_timeout_s, else None; `since` keeps when each stop was seen."""
        timeout = self.cfg.launcher.stopped_timeout_s
        member = self.stopped(name) if timeout else None
        if member is None:
            since.pop(name, None)
            return None
        now = time.monotonic()
        seconds = now - since.setdefault(name, now)
        if seconds <= timeout:
            return None
        since.pop(name, None)
        return stopped_reason(member, seconds, timeout)

    def restart_server(self, name: str, reason: str, code: int) -> int | None:
        """launcher.restart_failed_servers: start a dead (or hung: the backend stops it first)
        server again at its address, with the trainer's current weights.

        Those are the folder of the last disk weight update, which trainer rank 0 names in the
        served-weights record (discovery.py); before the first update, the initial model. Clients
        retry their requests meanwhile, and a weight update that comes while the server is down
        reaches it once it is back. Returns None once it is healthy again, else the run's exit
        code (the failure is reported).
        """
        n = self.restarts[name] = self.restarts.get(name, 0) + 1
        if n > MAX_SERVER_RESTARTS:
            return self.fail(name, code, f"{reason} after {MAX_SERVER_RESTARTS} restarts")
        spec, weights = self.restart_spec(name)
        say(
            f"{name} {reason}; restarting it at {self.addrs[name]} with {weights} "
            f"({n}/{MAX_SERVER_RESTARTS}, launcher.restart_failed_servers=true)",
            sys.stderr,
        )
        self.start(spec, {})
        if not self.await_health({name: self.addrs[name]}):
            return self.failed_code
        say(f"{name} is back at {self.addrs[name]}")
        return None

    def restart_spec(self, name: str) -> tuple[ProcessSpec, str]:
        """The server's plan entry loading the recorded current weights, and those in words."""
        spec = next(p for p in self.plan.processes if p.name == name)
        try:
            served = read_served_weights(record_root_of(self.cfg))
        except ValueError as e:
            say(f"warning: {e}", sys.stderr)
            served = None
        if served is None:
            return spec, "the initial model (no disk weight update recorded yet)"
        path, version = served
        command = with_flag(spec.command, "--model-path", path)
        if self.plan.server_kind == "builtin":  # SGLang before 0.5 has no --weight-version
            command = with_flag(command, "--weight-version", str(version))
        return dataclasses.replace(spec, command=command), f"weight version {version} ({path})"

    def _exit_status(self, name: str) -> int | None:
        self.refresh()
        return self.procs[name].poll()

    def exits(self) -> list[tuple[str, int]]:
        """(name, exit status) of every process that has exited, in start order."""
        return [(name, code) for name, proc in self.procs.items() if (code := proc.poll()) is not None]

    def _check(self, name: str, addr: str) -> bool:
        result = self.probe(name, addr)
        return is_healthy(addr) if result is None else result

    def monitor(self, mains: list[str]) -> int:
        """Wait until every main process exited 0 (returns 0) or any process failed (its code).

        A server that exits while trainers still run is a failure even with status 0: the
        trainers would hang waiting for it.
        """
        remaining = set(mains)
        watch = self.health_watch()
        trainers = [s.name for s in self.plan.by_role("trainer") if s.name in mains]
        self.phases_at_start = phase_stamps(self.logs_dir, trainers)  # an earlier attempt's, if any
        self.under_way = not trainers  # a trainer rank has begun its first step (silence_limit)
        self.stopped_since: dict[str, float] = {}
        self.stalled: dict[str, float] = {}  # server -> when it last answered (note_stalls)
        self.held: set[str] = set()  # silent servers kept past the limit while they compile
        self.compilers: dict[str, tuple[float, str]] = {}  # server -> (when, which) a compiler was seen
        phases = self.phase_watch(trainers)
        try:
            while remaining:
                self.refresh()
                for name, code in cause_first(self.exits()):
                    finished_before = code == 0 and name in mains and name not in remaining
                    if finished_before:
                        continue
                    if code == 0 and name in remaining:
                        remaining.discard(name)
                        say(f"{name} finished")
                        continue
                    if name in self.addrs and self.cfg.launcher.restart_failed_servers:
                        failed = self.restart_server(name, describe_exit(code), exit_code(code) or 1)
                        if failed is not None:
                            return failed
                        if watch:
                            watch.reset(name)
                        self.stalled.pop(name, None)
                        break  # self.procs changed: poll again from the start
                    return self.fail(name, exit_code(code) or 1, describe_exit(code) + self.why_failed(name))
                limit = self.silence_limit(watch)
                self.note_stalls(watch, limit)
                failed = self.check_silent(watch, limit)
                if failed is None:
                    failed = self.check_stopped(watch)
                if failed is None:
                    failed = self.check_phases(phases, remaining)
                if failed is not None:
                    return failed
                time.sleep(POLL_S)
        finally:
            if watch:
                watch.close()
        return 0

    def health_watch(self) -> HealthWatch | None:
        """Probe the run's servers while it goes on (launcher.server_health_timeout_s)."""
        timeout = self.cfg.launcher.server_health_timeout_s
        return HealthWatch(self.addrs, timeout, self._check) if self.addrs and timeout else None

    @property
    def logs_dir(self) -> Path:
        return Path(self.plan.run_dir) / "logs"

    def silence_limit(self, watch: HealthWatch | None) -> SilenceLimit | None:
        """launcher.server_health_timeout_s once a trainer rank has begun its first step, and
        launcher.server_startup_timeout_s (where longer) before: the servers are still starting
        while the trainer warms them up (rollout.server_warmup), and SGLang compiles kernels
        then with /health unanswered: on a fresh H100 (2026-12-06) flashinfer's sampler for a
        batch mixing greedy and sampled requests took longer than the 60 s health timeout of the
        chaos trials, each restart began the compile again, and the run never took a step."""
        if watch is None:
            return None
        if not self.under_way:
            self.under_way = any_phase_since(self.logs_dir, self.phases_at_start)
            if self.under_way:  # the health timeout counts from the first step at the earliest
                watch.count_from_now()
        startup = self.cfg.launcher.server_startup_timeout_s
        if self.under_way or startup <= watch.timeout_s:
            return health_limit(watch)
        return SilenceLimit(
            startup, "launcher.server_startup_timeout_s", " (no trainer rank has begun its first step yet)"
        )

    def note_stalls(self, watch: HealthWatch | None, limit: SilenceLimit | None) -> None:
        """Say once when a server has not answered /health for STALL_NOTICE_S (or half of the
        limit, which ends the run), and again when it answers. SGLang's own lines about it
        ("Health check failed", every 7 s) stay in its log."""
        if watch is None or limit is None:
            return
        silent = watch.silences(min(STALL_NOTICE_S, limit.seconds / 2))
        for name, seconds in silent.items():
            if name not in self.stalled:
                self.stalled[name] = time.monotonic() - seconds
                compiler = self.compiler_seen(name)
                allowed = self.compile_limit(limit) if compiler else limit
                if compiler:
                    cause = (
                        f"it is compiling kernels ({compiler} in its process tree) and answers nothing "
                        "meanwhile (for SGLang, the flashinfer-jit-cache package ships flashinfer's kernels built); "
                    )
                else:
                    cause = STALL_CAUSES.get(self.plan.server_kind, "")
                say(
                    f"{name} has not answered /health for {seconds:.0f} s: {cause}"
                    f"{self.outcome()} if it stays silent for {allowed.key} (log: {self.procs[name].log_path})"
                )
        for name in [n for n in self.stalled if not watch.failing(n)]:
            self.held.discard(name)
            say(f"{name} answers /health again, after {time.monotonic() - self.stalled.pop(name):.0f} s")

    def outcome(self) -> str:
        if self.cfg.launcher.restart_failed_servers:
            return "it is restarted (launcher.restart_failed_servers)"
        return "the run fails"

    def compiler_seen(self, name: str) -> str | None:
        """The compiler in the server's tree now, or seen there within COMPILE_GAP_S: a build runs
        one ninja per module, with Python's work between them."""
        now = time.monotonic()
        compiler = self.compiling(name)
        if compiler:
            self.compilers[name] = (now, compiler)
            return compiler
        seen_at, compiler = self.compilers.get(name, (float("-inf"), None))
        return compiler if now - seen_at <= COMPILE_GAP_S else None

    def compile_limit(self, limit: SilenceLimit) -> SilenceLimit:
        """How long a server that is compiling kernels may stay silent: launcher.server_startup_timeout_s
        where longer than the limit in force. A kernel build is not a hang, and a restart in the
        middle of one loses it: the new server begins it again (on a fresh H100, 2026-12-06, three
        restarts of the chaos runs' 60 s limit never got past flashinfer's sampler)."""
        startup = self.cfg.launcher.server_startup_timeout_s
        if startup <= limit.seconds:
            return limit
        return SilenceLimit(startup, "launcher.server_startup_timeout_s", " (while it compiles kernels)")

    def check_silent(self, watch: HealthWatch | None, limit: SilenceLimit | None) -> int | None:
        """A server that stopped answering /health: restart it or fail (the run's exit code)."""
        if watch is None or limit is None:
            return None
        for name, seconds in watch.silences(limit.seconds).items():
            compiler = self.compiler_seen(name)
            allowed = self.compile_limit(limit) if compiler else limit
            if seconds <= allowed.seconds:
                if name not in self.held:
                    self.held.add(name)
                    say(
                        f"{name} is still compiling kernels ({compiler}) after {seconds:.0f} s of silence; "
                        f"waiting for it: {self.outcome()} if it stays silent for {allowed.key}"
                    )
                continue
            addr = self.addrs[name]
            doing = f"it was still compiling kernels ({compiler})" if compiler else "it is hung or stopped"
            reason = f"did not answer http://{addr}/health for {seconds:.0f} s ({allowed.key}): {doing}"
            self.held.discard(name)
            self.compilers.pop(name, None)
            if self.cfg.launcher.restart_failed_servers:
                failed = self.restart_server(name, reason, 1)
                watch.reset(name)
                self.stalled.pop(name, None)
                return failed
            return self.fail(name, 1, reason + f"; if it is only slow (e.g. loading weights), raise {allowed.setting}")
        return None

    def check_stopped(self, watch: HealthWatch | None) -> int | None:
        """A process left in the stopped state (SIGSTOP) for launcher.stopped_timeout_s: fail the
        run naming it (a server is restarted instead with launcher.restart_failed_servers).

        A stopped trainer rank would otherwise hang the run silently: the other ranks wait for it
        in a collective (up to actor.collective_timeout_s) and nothing else watches trainers. Only
        the stopped state counts, not a debugger's tracing stop, so attaching gdb or py-spy is safe.
        """
        if not self.cfg.launcher.stopped_timeout_s:
            return None
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.stopped_since.pop(name, None)
                continue
            stopped = self.stopped_too_long(name, self.stopped_since)
            if stopped is None:
                continue
            reason = f"{stopped}{self.last_phase(name, ', in {}')}: the run cannot go on without it"
            if name in self.addrs and self.cfg.launcher.restart_failed_servers:
                failed = self.restart_server(name, reason, 1)
                if watch:
                    watch.reset(name)
                return failed
            return self.fail(name, 1, reason + STOPPED_ADVICE)
        return None

    def phase_watch(self, trainers: list[str]) -> PhaseWatch | None:
        """Watch these trainer ranks' phases (launcher.trainer_phase_timeout_s), from now."""
        timeout = self.cfg.launcher.trainer_phase_timeout_s
        return PhaseWatch(self.logs_dir, trainers, timeout) if timeout and trainers else None

    def check_phases(self, phases: PhaseWatch | None, remaining: set[str]) -> int | None:
        """Name a rank past half of launcher.trainer_phase_timeout_s in one phase on the console;
        fail the run, naming it, past the whole (the run's exit code)."""
        if phases is None or not phases.due():
            return None
        ages = [a for a in phases.ages() if a.name in remaining]
        key = f"launcher.trainer_phase_timeout_s={phases.timeout_s:g}"
        for a in phases.to_notice(ages):
            say(
                f"{a.name} has been in {a.phase} for {a.seconds:.0f} s: the run fails at {key} (log: "
                f"{self.procs[a.name].log_path})"
            )
        late = phases.overdue(ages)
        if late is None:
            return None
        return self.fail(
            late.name,
            1,
            f"has been in {late.phase} for {late.seconds:.0f} s ({key}) without starting another phase: it is "
            "hung (py-spy dump --pid PID shows where); if that phase is only slow, raise "
            "launcher.trainer_phase_timeout_s (null disables the check)",
        )

    def last_phase(self, name: str, form: str) -> str:
        """form.format('step N PHASE') from a trainer rank's RUN/logs/<name>.phase (the phase it was
        in: areal/trainer/grpo.py Phases), or '' where there is none (servers, the driver)."""
        try:
            text = (self.logs_dir / f"{name}.phase").read_text().strip()
        except OSError:
            return ""
        return form.format(text) if text else ""

    def why_failed(self, name: str) -> str:
        """What the log of a failed trainer rank says about a collective that timed out, and the
        state of the ranks it may have waited for ('' when its log shows no such timeout)."""
        proc = self.procs[name]
        proc.wait_output()
        text = "\n".join(tail_lines(proc.log_path, 200))
        # gloo's message; then NCCL's watchdog's (WorkNCCL(SeqNum=.., OpType=ALLREDUCE, .. Timeout(ms)=..))
        found = re.search(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>\w+) operation", text) or re.search(
            r"OpType=(?P<op>\w+).*?Timeout\(ms\)=(?P<ms>\d+)", text
        )
        if not found:
            return ""
        ms, op = found.group("ms"), found.group("op")
        others = [
            f"{other} ({'stopped' if self.is_stopped(other) else 'running'})"
            for other, p in self.procs.items()
            if other != name and other not in self.addrs and p.poll() is None
        ]
        return (
            f": a collective between trainer ranks waited {int(ms) / 1000:g} s for a {op.lower()} "
            f"(actor.collective_timeout_s={self.cfg.actor.collective_timeout_s:g}) and timed out, so another rank "
            f"did not take part in time{self.last_phase(name, ' (it waited in {})')}; still running then: "
            f"{', '.join(others) or 'none'} (see their logs). If a "
            "rank only works alone for longer (rank 0 gathering a batch, evaluating, saving), raise "
            "actor.collective_timeout_s"
        )

    def hold_servers(self, addrs: list[str]) -> int:
        """launcher.keep_servers: leave the servers up for manual debugging until Ctrl-C."""
        self.holding = True
        say(
            "launcher.keep_servers=true: servers stay up at "
            + ", ".join(f"http://{a}" for a in addrs)
            + " ; press Ctrl-C to stop them"
        )
        servers = [s.name for s in self.plan.by_role("server")]
        while True:
            self.refresh()
            for name in servers:
                code = self.procs[name].poll()
                if code is not None:
                    self.holding = False
                    return self.fail(name, exit_code(code) or 1, describe_exit(code))
            time.sleep(POLL_S)

    def fail(self, name: str, code: int, reason: str) -> int:
        proc = self.procs.get(name)
        if proc is not None:
            proc.wait_output()
        self.failed_code = code
        print(failure_report(name, proc.log_path if proc is not None else None, reason), file=sys.stderr, flush=True)
        return code
