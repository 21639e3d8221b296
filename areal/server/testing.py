"""Helpers for tests and benchmarks that need a running built-in server.

    from areal.server.testing import start_server
    server = start_server(model_dir, extra_args=["--dtype", "float32"])
    requests.post(server.url + "/generate", json={...})
    server.stop()

`start_server` picks a free port, starts `python -m areal.server` as a subprocess (output goes
to a log file, shown in the error if the server dies or never becomes healthy), and waits for
/health. `make_varied_model_dir` builds a tiny model whose greedy output is not one repeated
token (random init at the default scale gives almost uniform logits), which makes equality
tests meaningful.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerHandle:
    url: str
    port: int
    proc: subprocess.Popen
    log_path: str

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; kills it if it does not exit in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(model_path: str, port: int | None = None, extra_args=(),
                 timeout: float = 120.0, env: dict | None = None) -> ServerHandle:
    """Start `python -m areal.server` and return once /health answers 200."""
    import requests

    port = port or free_port()
    log = tempfile.NamedTemporaryFile("w", prefix=f"areal-server-{port}-", suffix=".log",
                                      delete=False)
    cmd = [sys.executable, "-m", "areal.server", "--model-path", str(model_path),
           "--port", str(port), *map(str, extra_args)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    handle = ServerHandle(f"http://127.0.0.1:{port}", port, proc, log.name)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"areal.server exited with {proc.returncode}:\n{handle.log()}")
        try:
            if requests.get(handle.url + "/health", timeout=2).status_code == 200:
                return handle
        except requests.RequestException:
            pass
        time.sleep(0.2)
    handle.stop()
    raise TimeoutError(f"areal.server not healthy after {timeout}s:\n{handle.log()}")


def make_varied_model_dir(path, *, scale: float = 8.0, seed: int = 0, **config_kwargs) -> Path:
    """A tiny random model (untied head, weights scaled up) with varied greedy outputs."""
    import torch
    from transformers import AutoModelForCausalLM

    from areal.models.tiny import make_tiny_model_dir

    path = Path(path)
    if (path / "varied.ok").exists():
        return path
    config_kwargs.setdefault("tie_word_embeddings", False)
    make_tiny_model_dir(path, seed=seed, **config_kwargs)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(scale)
    model.save_pretrained(path)
    (path / "varied.ok").write_text("")
    return path
