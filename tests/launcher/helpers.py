"""Shared pieces of the launcher tests: configs, plans with stand-in processes, orphan checks."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
FAKE_TRAINER = "tests.launcher.fake_trainer"
FAKE_SERVER = "tests.launcher.fake_server"


def make_cfg(tmp_path, *overrides: str, config: str = "gsm8k_grpo"):
    """A validated ExperimentConfig for a small CPU run rooted in tmp_path."""
    from areal.config import validate_config
    from launcher.compose import compose

    base = [
        "cluster=cpu",
        "actor.backend=fsdp:d2",
        "rollout.backend=sglang:d1",
        f"cluster.fileroot={tmp_path}",
        "cluster.n_gpus_per_node=3",
        "rollout.server=builtin",
        f"launcher.trainer_entry={FAKE_TRAINER}",
        f"launcher.driver_entry={FAKE_TRAINER}",
        "launcher.shutdown_grace_s=3",
        "launcher.server_startup_timeout_s=60",
        "sglang.model_path=tiny:default",
        "actor.path=tiny:default",
    ]
    return validate_config(compose(config, base + list(overrides)))


def make_plan(cfg, *, fake_servers: bool = True):
    """The real plan of cfg; with fake_servers the server module is the /health stand-in."""
    from areal.infra.host import HostFacts
    from launcher.plan import make_plan as plan_of

    plan = plan_of(cfg, HostFacts(python=PY))
    if fake_servers:
        for s in plan.by_role("server"):
            s.command = [PY, "-m", FAKE_SERVER, *s.command[3:]]
    return plan


def outputs(run_dir) -> dict[str, dict]:
    """What each fake process wrote under run_dir/out, by file stem."""
    out = Path(run_dir) / "out"
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))} if out.exists() else {}


def wait_gone(pids, timeout: float = 10.0) -> list[int]:
    """Pids still running (zombies count as gone) after waiting up to timeout."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def all_pids(run_dir) -> list[int]:
    """Pids the fake processes reported, grandchildren included."""
    pids = []
    for info in outputs(run_dir).values():
        pids += [info["pid"]] + ([info["grandchild"]] if info.get("grandchild") else [])
    return pids


def repo_env(**extra: str) -> dict[str, str]:
    """Environment for an areal-launch subprocess run from the repo root."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    env.pop("OMP_NUM_THREADS", None)
    return env


def free_ports(n: int = 1) -> int:
    """A port p with p..p+n-1 free right now (for base ports that other tests do not collide on)."""
    import random

    from areal.infra.ports import listen_range, port_is_free

    start, stop = listen_range()  # below the ephemeral range: no client connection takes them meanwhile
    rng = random.Random()
    for _ in range(200):
        p = rng.randrange(start, stop - n)
        if all(port_is_free(p + i) for i in range(n)):
            return p
    raise RuntimeError("no block of free ports found")


def write_yaml(
    path,
    *,
    fileroot,
    model: str = "tiny:default",
    rollout_nodes: int = 1,
    trainer_env: dict | None = None,
    extra: str = "",
) -> str:
    """An experiment YAML for `areal-launch --config PATH` with fake trainers on CPU."""
    trainer_env = trainer_env or {}
    env_lines = "".join(f'\n    {k}: "{v}"' for k, v in trainer_env.items()) or " {}"
    text = f"""\
defaults:
  - cluster: cpu
  - _self_
experiment_name: launcher_test
trial_name: t0
cluster:
  fileroot: {fileroot}
  n_gpus_per_node: 3
actor:
  backend: "fsdp:d2"
  path: "{model}"
rollout:
  backend: "sglang:d1"
  server: builtin
sglang:
  model_path: "{model}"
  dtype: float32
train_dataset:
  path: "synthetic:arith"
launcher:
  trainer_entry: {FAKE_TRAINER}
  driver_entry: {FAKE_TRAINER}
  shutdown_grace_s: 3
  server_startup_timeout_s: 120
  rollout_n_nodes: {rollout_nodes}
  server_base_port: {free_ports(2)}
  trainer_master_port: {free_ports(1)}
  trainer_env:{env_lines}
{extra}"""
    Path(path).write_text(text)
    return str(path)


def run_dir_of(fileroot) -> Path:
    return Path(fileroot) / "launcher_test" / "t0"


# Serves /health until trainer-0's phase file appears (its first step), then starts a child named
# ninja (a kernel build) and answers 503 until the release file exists; then the build ends, it
# answers again and writes the done file.
COMPILE_AFTER_FIRST_STEP = """
import os, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer
port, phase, ninja, release, done = int(sys.argv[1]), *sys.argv[2:6]
building = threading.Event()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503 if building.is_set() else 200)
        self.send_header("Content-Length", "0"); self.end_headers()
        if not building.is_set() and os.path.exists(release):
            open(done, "w").close()
    def log_message(self, *a): pass
srv = HTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
def wait(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"no {path} within 120 s")
        time.sleep(0.05)
wait(phase)
build = subprocess.Popen([ninja, "600"])
building.set()
wait(release)
build.kill(); build.wait()
building.clear()
time.sleep(600)
"""


def compiling_server_run(tmp_path, monkeypatch, *overrides):
    """A run whose server compiles (COMPILE_AFTER_FIRST_STEP) once trainer-0 began its first step,
    with a 1 s health timeout and a 30 s startup timeout; the build ends once the launcher said it
    waits for it past the health timeout. Returns (cfg, plan), the run dir written."""
    import launcher.supervisor as supervisor
    from launcher.cli import write_run_dir

    ninja = tmp_path / "bin" / "ninja"
    ninja.parent.mkdir()
    ninja.symlink_to(shutil.which("sleep"))  # a process named ninja: its name is the path it was started by
    release, done = tmp_path / "release", tmp_path / "done"
    cfg = make_cfg(
        tmp_path,
        f"launcher.server_base_port={free_ports(2)}",
        f"launcher.trainer_master_port={free_ports(1)}",
        "launcher.server_health_timeout_s=1",
        "launcher.server_startup_timeout_s=30",
        '+launcher.trainer_env.FAKE_PHASE="1"',
        f'+launcher.trainer_env.FAKE_WAIT_FILE="{done}"',
        *overrides,
    )
    plan = make_plan(cfg)
    srv = plan.by_role("server")[0]
    phase = Path(cfg.run_dir) / "logs" / "trainer-0.phase"
    srv.command = [sys.executable, "-c", COMPILE_AFTER_FIRST_STEP, str(srv.port), str(phase), str(ninja)]
    srv.command += [str(release), str(done)]
    write_run_dir(cfg, plan)
    said = supervisor.say

    def say(msg, stream=None):
        said(msg, stream)
        if "is still compiling kernels" in msg:
            release.touch()

    monkeypatch.setattr(supervisor, "say", say)
    return cfg, plan


def check_compiling_server_run(cfg, console: str) -> None:
    """What compiling_server_run's console must show: the build named, waited for, no failure."""
    held = next(line for line in console.splitlines() if "is still compiling kernels" in line)
    assert re.search(r"server-0 is still compiling kernels \(pid \d+ \(ninja\)\) after \d+ s of silence", held), held
    assert (
        "the run fails if it stays silent for launcher.server_startup_timeout_s=30 (while it compiles kernels)" in held
    )
    assert "did not answer" not in console
    assert wait_gone(all_pids(cfg.run_dir)) == []
