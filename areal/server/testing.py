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

Tests wait for conditions, never for time: `wait_for` polls a condition (its deadline only
guards against a hang), `server_load` reads what the server holds, and `pause_mid_generation`
pauses a server while its requests are certainly generating.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from areal.infra.health import ServerStartupError, wait_healthy
from areal.infra.ports import free_port  # noqa: F401 (tests import it from here)


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


def start_server(
    model_path: str, port: int | None = None, extra_args=(), timeout: float = 120.0, env: dict | None = None
) -> ServerHandle:
    """Start `python -m areal.server` and return once /health answers 200 (areal.infra.health's
    wait: a ServerStartupError with the server's log if it exits first or is not up in `timeout`)."""
    port = port or free_port()
    log = tempfile.NamedTemporaryFile("w", prefix=f"areal-server-{port}-", suffix=".log", delete=False)
    cmd = [
        sys.executable,
        "-m",
        "areal.server",
        "--model-path",
        str(model_path),
        "--port",
        str(port),
        *map(str, extra_args),
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    handle = ServerHandle(f"http://127.0.0.1:{port}", port, proc, log.name)
    try:
        wait_healthy(
            {"areal.server": f"127.0.0.1:{port}"},
            timeout,
            lambda _: proc.poll(),
            0.2,
            timeout_key="start_server(timeout=...)",
        )
    except ServerStartupError as e:
        handle.stop()
        raise type(e)(e.name, f"{e}; its log ({handle.log_path}):\n{handle.log()}", e.returncode) from None
    return handle


def wait_for(condition, what: str, timeout: float = 120.0, interval: float = 0.02):
    """Poll `condition()` until it returns something true, and return that. `timeout` only
    guards against a hang; past it, AssertionError naming `what` (a str or a callable giving one)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not after {timeout:.0f}s: {what() if callable(what) else what}")
        time.sleep(interval)


def server_load(url: str, headers: dict | None = None) -> dict:
    """/get_server_info's load: running, waiting, paused, accepted (held at the gate too), capacity."""
    import requests

    return requests.get(url + "/get_server_info", headers=headers, timeout=30).json()["load"]


def pause_mid_generation(
    url: str,
    start,
    n: int = 1,
    *,
    mode: str | None = "in_place",
    headers: dict | None = None,
    also=None,
    timeout: float = 300.0,
):
    """Pause the server at `url` with `mode` (None: no mode sent, the default abort) while `n`
    requests are generating on it; returns (what `start` returned, the pause's answer).

    `start()` sends the n /generate requests (the server runs nothing else) and returns their
    futures. Seeing all n running does not mean they still are when the pause lands: a fast
    machine can finish one in between. The pause's answer says how many it caught; when that is
    fewer than n, the server is continued, the requests are waited for and sent again, so a lost
    race costs a retry rather than the test. Caught means mid-generation: each has at least one
    token and fewer than its max_new_tokens. `also()`, if given, is a further condition on the
    paused server (how far the requests got, say); false, the round is void too."""
    import requests

    caught_key = "requests_aborted" if mode in (None, "abort") else "requests_held"
    body = {} if mode is None else {"mode": mode}
    deadline = time.monotonic() + timeout
    while True:
        futures = start()
        running = wait_for(
            lambda: (
                (server_load(url, headers)["running"] == n and "running")
                or (any(f.done() for f in futures) and "finished")
            ),
            lambda: f"{n} requests running on {url}: {server_load(url, headers)}",
        )
        answer = requests.post(url + "/pause_generation", json=body, headers=headers, timeout=60).json()
        if running == "running" and answer[caught_key] == n and (also is None or also()):
            return futures, answer
        print(f"pause_mid_generation: round void ({running}, {answer}), again", flush=True)
        requests.post(url + "/continue_generation", json={}, headers=headers, timeout=60)
        for f in futures:
            f.result(timeout=max(1.0, deadline - time.monotonic()))
        if time.monotonic() > deadline:
            raise AssertionError(f"no pause caught {n} requests mid-generation in {timeout:.0f}s")


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
