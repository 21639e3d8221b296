"""Questions to an NVIDIA MPS control daemon (launcher.mps), and a process's own attachment.

The daemon answers through its control program run without arguments, one command per line on
stdin, in the pipe folder that CUDA_MPS_PIPE_DIRECTORY names: `get_server_list` gives the MPS
servers' pids, `get_client_list PID` a server's clients. The launcher (launcher/mps.py) starts the
daemon and asks after the servers; a trainer asks after itself once its CUDA context exists,
which is the one moment it is sure to be alive and, if MPS works, attached. Torch-free.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
COMMAND_TIMEOUT_S = 10.0
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"


def control_program() -> str | None:
    """The control program's path, or None where the driver's utilities are not installed."""
    return shutil.which(CONTROL)


def ask(command: str, env: dict[str, str], timeout_s: float = COMMAND_TIMEOUT_S) -> str | None:
    """The daemon's answer to one command, or None when no daemon answers in env's pipe folder."""
    program = control_program()
    pipe = env.get(PIPE_ENV)
    if program is None or not pipe or not Path(pipe).is_dir():
        return None
    try:
        done = subprocess.run(
            [program], input=command + "\n", env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def pids(text: str | None) -> list[int]:
    """The process ids of an answer: one per line (other lines are left out)."""
    return [int(word) for word in (text or "").split() if word.isdigit()]


def servers(env: dict[str, str]) -> list[int]:
    return pids(ask("get_server_list", env))


def clients(env: dict[str, str], of_servers: list[int] | None = None) -> list[int]:
    """The pids of every client of the daemon's MPS servers (of_servers: those already listed)."""
    out = []
    for server in servers(env) if of_servers is None else of_servers:
        out += pids(ask(f"get_client_list {server}", env))
    return out


def report_attachment(logger: logging.Logger, what: str) -> bool | None:
    """Log whether this process is a client of the run's MPS daemon; call it once CUDA is up.
    None (and no line) when the process was given no pipe folder (launcher.mps is off)."""
    env = dict(os.environ)
    if not env.get(PIPE_ENV):
        return None
    mps_servers = servers(env)
    attached = os.getpid() in clients(env, mps_servers)
    if attached:
        logger.info("%s (pid %d) is a client of MPS server %s (launcher.mps)", what, os.getpid(), mps_servers)
    else:
        logger.warning(
            "%s (pid %d) is not a client of the MPS daemon in %s: it runs time-sliced, as without "
            "launcher.mps; the daemon's logs are in %s",
            what,
            os.getpid(),
            env[PIPE_ENV],
            env.get("CUDA_MPS_LOG_DIRECTORY", "(unknown)"),
        )
    return attached
