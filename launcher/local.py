"""The local backend: run a LaunchPlan as subprocesses of this machine.

Servers whose planned port is taken move to the next free one (and MASTER_PORT likewise). Every
process writes `{run_dir}/logs/<role>-<index>.log`, and its lines appear live in the console as
`[role-index] line`, all but the engines' and servers' per-step INFO records (launcher/console.py).
The sequence, the failure handling and the teardown rules are `Supervisor`'s
(launcher/supervisor.py); this module only starts, watches and stops the processes. With
launcher.mps it also runs the run's MPS control daemon (launcher/mps.py): started before the
servers, asked which processes attached while the run goes on (and a warning if it exits on its
own), quit after the last one stopped.
"""

from __future__ import annotations

import os

from areal.config import ExperimentConfig

from .console import console_program, process_console
from .mps import AttachWatch, MpsDaemon
from .plan import TRAINER_HEAD, LaunchPlan, ProcessSpec
from .procs import ManagedProcess, advertised_host, child_env, next_free_port, stop_all, with_port
from .supervisor import Supervisor, TreeCheck, compiler_in_tree, log_path, say


def run_local(plan: LaunchPlan, cfg: ExperimentConfig) -> int:
    return LocalRun(plan, cfg).execute()


def assign_ports(plan: LaunchPlan, log=say) -> None:
    """Move servers whose port is taken, and MASTER_PORT likewise, to the next free port."""
    servers = plan.by_role("server")
    planned = {s.port for s in servers if s.port}
    taken: set[int] = set()
    for s in servers:
        if not s.port:
            continue
        port = next_free_port(s.port, avoid=taken | (planned - {s.port}))
        if port != s.port:
            log(f"{s.name}: port {s.port} is in use; using {port}")
            s.port, s.command = port, with_port(s.command, port)
        taken.add(port)
    trainers = plan.by_role("trainer")
    if trainers and "MASTER_PORT" in trainers[0].env:
        want = int(trainers[0].env["MASTER_PORT"])
        port = next_free_port(want, avoid=taken)
        if port != want:
            log(f"MASTER_PORT {want} is in use; using {port}")
        for t in trainers:
            t.env["MASTER_PORT"] = str(port)
            if t.env.get("MASTER_ADDR") == TRAINER_HEAD:  # one machine: rank 0 is here
                t.env["MASTER_ADDR"] = "127.0.0.1"


class LocalRun(Supervisor):
    """Every process is a child of this launcher."""

    procs: dict[str, ManagedProcess]

    def __init__(self, plan: LaunchPlan, cfg: ExperimentConfig):
        super().__init__(plan, cfg)
        self.retired: list[ManagedProcess] = []  # replaced by a restart; their orphans still count
        self._stopped = TreeCheck()
        self._compiler = TreeCheck(compiler_in_tree)
        self.mps: MpsDaemon | None = None
        self.mps_watch: AttachWatch | None = None

    def prepare(self) -> None:
        assign_ports(self.plan)
        if self.plan.mps:
            self.mps = MpsDaemon(self.plan.mps, dict(os.environ))
            self.mps.start()
            devices = ",".join(map(str, self.plan.mps.devices))
            pid, logs = self.mps.proc.pid, self.plan.mps.log_dir
            say(f"started the MPS control daemon (pid {pid}) for devices [{devices}]; logs: {logs}")
            names = [p.name for p in self.plan.processes]
            self.mps_watch = AttachWatch(self.mps, names, self.cfg.launcher.server_startup_timeout_s, say)

    def refresh(self) -> None:
        self._say_if_mps_exited()
        if self.mps_watch:
            self.mps_watch.poll({name: p.pid for name, p in self.procs.items() if p.poll() is None})

    def _say_if_mps_exited(self) -> None:
        if self.mps and (notice := self.mps.exit_notice()):
            say(notice)

    def start(self, spec: ProcessSpec, extra: dict[str, str]) -> ManagedProcess:
        env = child_env(spec.env, extra, cpu=self.plan.device == "cpu", procs_on_node=len(self.plan.processes))
        old = self.procs.get(spec.name)
        if old is not None:  # a restart; a hung one still holds its port: stop it first
            if old.poll() is None:
                old.stop(self.cfg.launcher.shutdown_grace_s)
            self.retired.append(old)
        proc = ManagedProcess(
            spec.name,
            spec.command,
            env,
            log_path=log_path(self.plan, spec),
            sink=process_console(spec.name, console_program(self.plan, spec)),
        )
        self.procs[spec.name] = proc
        say(f"started {spec.name} (pid {proc.pid}); log: {proc.log_path}")
        return proc

    def server_addrs(self, servers: list[ProcessSpec]) -> dict[str, str]:
        return {s.name: f"{advertised_host(s.command)}:{s.port}" for s in servers}

    def stopped(self, name: str) -> str | None:
        return self._stopped(self.procs[name].pid)

    def compiling(self, name: str) -> str | None:
        proc = self.procs[name]
        return self._compiler(proc.pid) if proc.poll() is None else None

    def teardown(self) -> None:
        self._say_if_mps_exited()
        if self.mps_watch:
            self.mps_watch.finish({name: p.pid for name, p in self.procs.items() if p.poll() is None})
        running = [p.name for p in self.procs.values() if p.poll() is None]
        if running:
            say(f"stopping {len(running)} process(es): " + ", ".join(running))
        stop_all(list(self.procs.values()) + self.retired, self.cfg.launcher.shutdown_grace_s)
        if self.mps:  # after its clients: a daemon told to quit waits for them
            self.mps.stop(self.cfg.launcher.shutdown_grace_s)
