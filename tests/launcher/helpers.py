"""Shared pieces of the launcher tests: configs, plans with stand-in processes, orphan checks."""

from __future__ import annotations

import json
import os
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
