"""launcher.mps: the run's NVIDIA MPS control daemon, from start to quit.

Two processes on one GPU take turns in time slices: while SGLang decodes, the trainer's kernels
wait, and the other way round. Under MPS (Multi-Process Service) their kernels share the GPU's
multiprocessors at the same time, and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps a process's share.
A CUDA process attaches when its CUDA_MPS_PIPE_DIRECTORY holds a running control daemon (its
socket `control`); if none answers, CUDA runs it without MPS and says nothing, so the launcher
asks the daemon which processes attached and says so on the console.

The daemon runs in the foreground (`nvidia-cuda-mps-control -f`) as a child of the launcher:
it dies with it, and its MPS servers (forked by it on the first client) are in its process tree.
Commands go through the same program without arguments, one per line on its stdin
(`get_server_list`, `get_client_list PID`, `quit`). Torch-free.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import psutil

from areal.infra.mps import CONTROL, ask, clients, control_program, pids

from .plan import MpsPlan
from .procs import LaunchError, ManagedProcess, stop_all

START_TIMEOUT_S = 30.0
ATTACH_CHECK_S = 1.0  # how often AttachWatch asks the daemon for its clients (a few ms each time)
POLL_S = 0.2


class MpsDaemon:
    """One control daemon for the plan's devices, with its pipes in plan.pipe_dir."""

    def __init__(self, plan: MpsPlan, base_env: dict[str, str]):
        self.plan = plan
        self.env = {**base_env, **plan.env(), "CUDA_VISIBLE_DEVICES": ",".join(map(str, plan.devices))}
        self.proc: ManagedProcess | None = None
        self.exit_reported = False

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the daemon and wait until it answers a command."""
        program = control_program()
        if program is None:
            raise LaunchError(
                f"launcher.mps=true: {CONTROL} is not on PATH (it comes with the NVIDIA driver's "
                "utilities); install them, or set launcher.mps=false"
            )
        if self.answers():
            raise LaunchError(
                f"launcher.mps=true: an MPS control daemon already answers in {self.plan.pipe_dir} (an earlier "
                f"run of this run directory?); stop it with `echo quit | CUDA_MPS_PIPE_DIRECTORY="
                f"{self.plan.pipe_dir} {CONTROL}`, then launch again"
            )
        shutil.rmtree(self.plan.pipe_dir, ignore_errors=True)  # a dead daemon's sockets
        Path(self.plan.pipe_dir).mkdir(parents=True, exist_ok=True)
        Path(self.plan.log_dir).mkdir(parents=True, exist_ok=True)
        self.proc = ManagedProcess(
            "mps-control", [program, "-f"], self.env, log_path=str(Path(self.plan.log_dir) / "foreground.log")
        )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            code = self.proc.poll()
            if code is not None or time.monotonic() > deadline:
                self.proc.stop(1.0)
                why = f"exited with code {code}" if code is not None else f"did not answer within {timeout_s:g} s"
                tail = "\n".join(self.proc.tail) or "(no output)"
                raise LaunchError(
                    f"launcher.mps=true: the MPS control daemon ({program} -f) {why}; its last output:\n"
                    f"{tail}\nlogs: {self.plan.log_dir}; the GPU's compute mode may refuse MPS "
                    "(nvidia-smi -q | grep 'Compute Mode'), or set launcher.mps=false"
                )
            time.sleep(POLL_S)

    def ask(self, command: str) -> str | None:
        """The daemon's answer to one command, or None when no daemon answers in the pipe folder."""
        return ask(command, self.env)

    def answers(self) -> bool:
        """A daemon listens on the pipe folder's control socket and answers there."""
        return (Path(self.plan.pipe_dir) / "control").exists() and self.ask("get_server_list") is not None

    def clients(self, of_servers: list[int] | None = None) -> list[int]:
        """The pids of every client of the daemon's MPS servers (of_servers: those already listed)."""
        return clients(self.env, of_servers)

    def attached(self, trees: dict[str, int], of_servers: list[int] | None = None) -> dict[str, list[int]]:
        """Which of the named process trees (name -> root pid) have a process among the clients."""
        clients = set(self.clients(of_servers))
        out = {}
        for name, root in trees.items():
            try:
                members = {root} | {p.pid for p in psutil.Process(root).children(recursive=True)}
            except psutil.NoSuchProcess:
                members = {root}
            out[name] = sorted(members & clients)
        return out

    def exit_notice(self) -> str | None:
        """Once, after the daemon exited on its own: what that means for the run, naming its logs.
        Processes started afterwards (restarts) find no daemon and run time-sliced, as without
        launcher.mps; how the running clients fare is the driver's (not measured here)."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None or self.exit_reported:
            return None
        self.exit_reported = True
        return (
            f"warning: launcher.mps: the MPS control daemon (pid {self.proc.pid}) exited with code {code} "
            "while the run went on; processes started from now on run time-sliced, as without it. "
            f"Its logs: {self.plan.log_dir}"
        )

    def stop(self, grace_s: float) -> None:
        """Ask the daemon to quit (its clients are gone by now), then stop what is left of its tree."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.ask("quit")
            deadline = time.monotonic() + grace_s
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(POLL_S)
        stop_all([self.proc], grace_s)
        shutil.rmtree(self.plan.pipe_dir, ignore_errors=True)


class AttachWatch:
    """Says once on the console when every process of the run has attached to the daemon, or
    which have not within timeout_s of the last one's start (those run time-sliced, as without
    launcher.mps). What it saw goes to LOG_DIR/attached.json (the clients' pids by process, the
    MPS servers' pids) then, or at the end of a run that ended first (`finish`)."""

    def __init__(self, daemon: MpsDaemon, expected: list[str], timeout_s: float, say, every_s: float | None = None):
        self.daemon = daemon
        self.expected = list(expected)
        self.say = say
        self.every_s = ATTACH_CHECK_S if every_s is None else every_s
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.started: set[str] = set()
        self.seen: dict[str, list[int]] = {}  # name -> its clients' pids, once seen attached
        self.servers: list[int] = []
        self.next_check = 0.0
        self.done = False

    def poll(self, running: dict[str, int]) -> None:
        """running: the processes running now, name -> root pid (a restarted one has a new pid)."""
        now = time.monotonic()
        if self.done or now < self.next_check:
            return
        self.next_check = now + self.every_s
        if set(running) - self.started:  # each start gets its full time to initialise CUDA
            self.started |= set(running)
            self.deadline = now + self.timeout_s
        self._look(running)
        missing = self.missing()
        if not missing:
            servers = ", ".join(map(str, self.servers)) or "?"
            self.say(f"mps: {', '.join(self.expected)} attached (MPS server pid {servers})")
        elif now > self.deadline:
            self.say(
                f"warning: launcher.mps: {', '.join(missing)} did not attach to the MPS daemon within "
                f"{self.timeout_s:g} s and run time-sliced, as without it; the daemon's logs are in "
                f"{self.daemon.plan.log_dir}"
            )
        else:
            return
        self.done = True
        self._record()

    def finish(self, running: dict[str, int]) -> None:
        """At the end of the run, before its processes stop: a last look, and the record."""
        if not self.done:
            self._look(running)
            self.done = True
            self._record()

    def missing(self) -> list[str]:
        return [name for name in self.expected if name not in self.seen]

    def _look(self, running: dict[str, int]) -> None:
        self.servers = pids(self.daemon.ask("get_server_list")) or self.servers
        attached = self.daemon.attached({n: pid for n, pid in running.items() if n in self.expected}, self.servers)
        self.seen.update({name: found for name, found in attached.items() if found})

    def _record(self) -> None:
        record = {"attached": self.seen, "missing": self.missing(), "mps_servers": self.servers}
        (Path(self.daemon.plan.log_dir) / "attached.json").write_text(json.dumps(record, indent=1) + "\n")
