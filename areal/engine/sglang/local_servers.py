"""Inference servers started by the client itself (RemoteSGLangEngine.from_pretrained).

The command lines come from the helpers the launcher's plan uses (`areal.infra.servers`), so a
server started here is the same program with the same flags as one `areal-launch` starts. Only
the ports differ: they are picked free on this machine. The servers live in their own
process groups, log to `{run_dir}/logs/server-<i>.log`, and stop with the engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from areal.infra.health import ServerStartupError, wait_healthy


def server_kind(cfg) -> str:
    """sglang or builtin, as the launcher would resolve rollout.server for this machine."""
    from areal.infra.host import detect_host_facts, resolve_device, resolve_server_kind

    facts = detect_host_facts()
    return resolve_server_kind(cfg, facts, resolve_device(cfg, facts))


class LocalServers:
    """dp servers with tp devices each, started as subprocesses and owned by the caller."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.procs: list[subprocess.Popen] = []
        self.addrs: list[str] = []
        self.logs: list[Path] = []
        self.kind: str | None = None  # sglang or builtin, once started
        self.pause_mode: str | None = None  # rollout.pause_mode resolved for kind, once started

    def start(self) -> list[str]:
        from areal.config.parallel import parse_parallel
        from areal.infra.host import detect_host_facts, resolve_device, resolve_server_kind
        from areal.infra.pause import resolve_pause_mode
        from areal.infra.ports import free_port_block
        from areal.infra.servers import indexed_server_command

        cfg = self.cfg
        st = parse_parallel(cfg.rollout.backend, allowed_backends=("sglang",))
        facts = detect_host_facts()
        device = resolve_device(cfg, facts)
        kind = self.kind = resolve_server_kind(cfg, facts, device)
        self.pause_mode = resolve_pause_mode(cfg.rollout.pause_mode, kind)
        base = free_port_block(st.dp, cfg.sglang.host)
        log_dir = Path(cfg.run_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(st.dp):
            port = base + i
            command = indexed_server_command(cfg, i, port=port, kind=kind, pause_mode=self.pause_mode, facts=facts)
            # server i on devices i*tp ..: the servers take the first devices, as in the plan
            devices = ",".join(str(d) for d in range(i * st.tp, (i + 1) * st.tp)) if device == "cuda" else ""
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": devices, **cfg.launcher.server_env}
            log = log_dir / f"server-{i}.log"
            with open(log, "ab") as out:
                proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.procs.append(proc)
            self.logs.append(log)
            self.addrs.append(f"{cfg.sglang.host}:{port}")
        return list(self.addrs)

    def wait_healthy(self, timeout: float, headers: dict[str, str] | None = None) -> None:
        """Block until every server answers /health; fail early with the log of one that died."""
        index = {a: i for i, a in enumerate(self.addrs)}
        try:
            wait_healthy(
                {a: a for a in self.addrs},
                timeout,
                lambda a: self.procs[index[a]].poll(),
                0.25,
                headers=headers,
                timeout_key="rollout.setup_timeout_s",
            )
        except ServerStartupError as e:
            log = self.logs[index[e.name]]
            raise type(e)(
                e.name, f"inference server {e}; its log ({log}) ends with:\n{_tail(log)}", e.returncode
            ) from None

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
