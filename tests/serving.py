"""Helpers for tests that need a running built-in server (benchmark scripts start theirs with
areal/infra/server_process.py's `start_builtin_server` directly).

    from tests.serving import start_server
    server = start_server(model_dir, extra_args=["--dtype", "float32"])
    requests.post(server.url + "/generate", json={...})
    server.stop()

`start_server` picks a free port, starts `python -m areal.server` (its output in a log file,
whose end the error shows if the server dies or never becomes healthy) and waits for /health.
`served_engine` adds a RemoteSGLangEngine of it. `make_varied_model_dir` builds a tiny model
whose greedy output is not one repeated token (random init at the default scale gives almost
uniform logits), which makes equality tests meaningful.

Tests wait for conditions, never for time: `wait_for` polls a condition (its deadline only
guards against a hang), `server_load` reads what the server holds, and `pause_mid_generation`
pauses a server while its requests are certainly generating.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path

from areal.infra.server_process import start_builtin_server

# the servers' logs, removed when the test process ends (a run of the suite once left 1,400 in /tmp)
_LOG_DIR = tempfile.TemporaryDirectory(prefix="areal-test-server-logs-")


def start_server(model_path, port=None, extra_args=(), timeout: float = 120.0, env=None):
    """start_builtin_server, its log in this test process's own folder."""
    return start_builtin_server(model_path, port, extra_args, timeout, env, log_dir=_LOG_DIR.name)


@contextlib.contextmanager
def served_engine(model_dir: str, consumer_batch_size: int = 2):
    """A built-in server of `model_dir` (float32, one thread) and an engine of it; both stopped after."""
    from areal.engine.sglang.client import RemoteSGLangEngine

    server = start_server(model_dir, extra_args=["--dtype", "float32"], env={"OMP_NUM_THREADS": "1"})
    engine = RemoteSGLangEngine.from_pretrained(
        model_dir, server_addrs=[server.url], rollout={"consumer_batch_size": consumer_batch_size}
    )
    try:
        yield engine
    finally:
        engine.destroy()
        server.stop()


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
