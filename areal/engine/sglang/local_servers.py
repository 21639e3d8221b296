"""Inference servers started by the client itself (RemoteSGLangEngine.from_pretrained).

The command lines come from the helpers the launcher's plan uses (`areal.infra.servers`), so a
server started here is the same program with the same flags as one `areal-launch` starts. Only
the ports differ: they are picked free on this machine. The servers start as the launcher's
do (areal/infra/server_process.py: their own process groups, dying with this process if it is
killed), log to `{run_dir}/logs/server-<i>.log`, and stop with the engine.
"""

from __future__ import annotations

import os
from pathlib import Path

from areal.infra.server_process import ServerProcess, start_server_process, stop_servers, wait_until_serving


def server_kind(cfg) -> str:
    """sglang or builtin, as the launcher would resolve rollout.server for this machine."""
    from areal.infra.host import detect_host_facts, resolve_device, resolve_server_kind

    facts = detect_host_facts()
    return resolve_server_kind(cfg, facts, resolve_device(cfg, facts))


class LocalServers:
    """dp servers with tp devices each, started as subprocesses and owned by the caller."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.servers: list[ServerProcess] = []
        self.kind: str | None = None  # sglang or builtin, once started
        self.pause_mode: str | None = None  # rollout.pause_mode resolved for kind, once started

    @property
    def procs(self) -> list:
        """The servers' processes (subprocess.Popen), while they are owned."""
        return [s.proc for s in self.servers]

    @property
    def addrs(self) -> list[str]:
        return [s.addr for s in self.servers]

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
            addr = f"{cfg.sglang.host}:{port}"
            self.servers.append(start_server_process(command, addr=addr, log_path=log_dir / f"server-{i}.log", env=env))
        return self.addrs

    def wait_healthy(self, timeout: float, headers: dict[str, str] | None = None) -> None:
        """Block until every server answers /health; fail early with the log of one that died."""
        wait_until_serving(
            self.servers, timeout, timeout_key="rollout.setup_timeout_s", headers=headers, kind="inference server"
        )

    def stop(self) -> None:
        """SIGTERM every server's process group, then SIGKILL after launcher.shutdown_grace_s."""
        stop_servers(self.servers, self.cfg.launcher.shutdown_grace_s)
        self.servers.clear()
