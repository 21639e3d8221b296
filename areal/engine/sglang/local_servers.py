"""Inference servers started by the client itself (RemoteSGLangEngine.from_pretrained).

The command lines and environments come from the launcher's own plan (`launcher.plan.make_plan`),
so a server started here is the same program with the same flags as one `areal-launch` starts.
Only the ports differ: they are picked free on this machine. The servers live in their own
process groups, log to `{run_dir}/logs/server-<i>.log`, and stop with the engine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from areal.engine.sglang.http import is_healthy


def free_port_block(count: int, host: str = "127.0.0.1", start: int = 20000, stop: int = 60000) -> int:
    """A base port such that base .. base+count-1 are free now (a short race remains).

    The scan starts at a pid-dependent offset so concurrent processes rarely pick the same block.
    """
    for base in range(start + (os.getpid() % 1000) * 10, stop, count + 1):
        if all(_port_free(host, base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports between {start} and {stop} on {host}")


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def server_kind(cfg) -> str:
    """sglang or builtin, as the launcher would resolve rollout.server for this machine."""
    from launcher.host import detect_host_facts
    from launcher.plan import resolve_device, resolve_server_kind

    facts = detect_host_facts()
    return resolve_server_kind(cfg, facts, resolve_device(cfg, facts))


class LocalServers:
    """dp servers with tp devices each, started as subprocesses and owned by the caller."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.procs: list[subprocess.Popen] = []
        self.addrs: list[str] = []
        self.logs: list[Path] = []

    def start(self) -> list[str]:
        from launcher.host import detect_host_facts
        from launcher.plan import make_plan

        st = self.cfg.rollout.backend
        base = free_port_block(_dp(st), self.cfg.sglang.host)
        cfg = self.cfg.model_copy(deep=True)
        cfg.launcher.server_base_port = base
        cfg.launcher.rollout_n_nodes = max(1, cfg.launcher.rollout_n_nodes)
        plan = make_plan(cfg, detect_host_facts())
        log_dir = Path(cfg.run_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        for spec in plan.by_role("server"):
            log = log_dir / f"{spec.name}.log"
            with open(log, "ab") as out:
                proc = subprocess.Popen(spec.command, env={**os.environ, **spec.env}, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            self.procs.append(proc)
            self.logs.append(log)
            self.addrs.append(f"{cfg.sglang.host}:{spec.port}")
        return list(self.addrs)

    def wait_healthy(self, timeout: float, headers: dict[str, str] | None = None) -> None:
        """Block until every server answers /health; fail early with the log of one that died."""
        deadline = time.monotonic() + timeout
        pending = set(range(len(self.procs)))
        while pending:
            for i in sorted(pending):
                if self.procs[i].poll() is not None:
                    raise RuntimeError(
                        f"inference server {self.addrs[i]} exited with code {self.procs[i].returncode} "
                        f"during start-up; its log ({self.logs[i]}) ends with:\n{_tail(self.logs[i])}")
                if is_healthy(self.addrs[i], timeout=2.0, headers=headers):
                    pending.discard(i)
            if pending and time.monotonic() > deadline:
                names = ", ".join(self.addrs[i] for i in sorted(pending))
                raise TimeoutError(f"inference servers {names} were not healthy after {timeout:.0f}s "
                                   "(rollout.setup_timeout_s); see their logs in "
                                   f"{self.logs[0].parent}")
            if pending:
                time.sleep(0.25)

    def stop(self) -> None:
        """SIGTERM every server's process group, then SIGKILL after launcher.shutdown_grace_s."""
        grace = self.cfg.launcher.shutdown_grace_s
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)
        self.procs.clear()


def _dp(backend: str) -> int:
    from areal.config.parallel import parse_parallel

    return parse_parallel(backend, allowed_backends=("sglang",)).dp


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
