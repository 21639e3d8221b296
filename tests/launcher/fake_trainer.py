"""Stand-in for a trainer worker or rollout driver in launcher tests (no torch).

    python -m tests.launcher.fake_trainer --config RUN_DIR/config.yaml

Touches `$AREAL_RUN_DIR/out/<role>-<rank>.started` at once. Once its servers answer /health and
are published (as a real trainer waits for them), writes what
it received (its torch.distributed env, devices, server addresses, whether each server answered
/health) to `$AREAL_RUN_DIR/out/<role>-<rank>.json`, then behaves as the
environment asks:
  FAKE_FAIL_RANK=r, FAKE_EXIT=c   rank r exits with code c (after FAKE_FAIL_AFTER_S seconds)
  FAKE_SLEEP_S=s                   sleep s seconds before exiting 0
  FAKE_SPAWN_CHILD=1               start a grandchild that sleeps, pid in the JSON
  FAKE_IGNORE_TERM=1               ignore SIGTERM (the launcher must SIGKILL it)
  FAKE_STOP_RANK=r                 rank r sends itself SIGSTOP (a hung rank; SIGCONT resumes it)
  FAKE_KILL_PEER=r                 SIGKILL rank r, wait until it is dead, then exit FAKE_EXIT (a
                                   peer whose collective broke, exiting within milliseconds)
  FAKE_UNTIL_RESTARTED=name        first wait until the launcher has started process `name` a
                                   second time (two start banners in its log); exit 1 after 120 s
  FAKE_WAIT_FILE=path              first wait until that file exists; exit 1 after 60 s
  FAKE_EXIT_AT_START=c             exit with code c at once, before waiting for the servers
  FAKE_PHASE=1                     first write RUN/logs/trainer-<rank>.phase (a rank that began a step)
With CUDA_MPS_PIPE_DIRECTORY set it attaches to the stand-in MPS daemon as a CUDA process would to
the real one (tests/launcher/mps_control_standin: its pid goes to the folder's `clients`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ENV_KEYS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "AREAL_SERVER_ADDRS",
    "AREAL_RUN_DIR",
    "AREAL_CONFIG",
    "AREAL_RAY_NODE_ID",
    "AREAL_NODE_IP",
    "FAKE_NODE_TAG",
)


def healthy(addr: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def spawn_sleeper() -> int:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    return child.pid


def started_twice(run_dir: Path, name: str, timeout: float = 120.0) -> bool:
    log = run_dir / "logs" / f"{name}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_text(errors="replace").count(f"=== {name} started") >= 2:
            return True
        time.sleep(0.1)
    return False


def wait_for(what: str, ready, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError(f"fake trainer: waited {timeout} s for {what}")


def pid_dead(pid: int) -> bool:
    """Gone or a zombie: the launcher's poll() sees the exit (not our child, so no waitpid)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def recorded_pid(record: Path) -> int | None:
    try:
        return json.loads(record.read_text())["pid"]
    except (FileNotFoundError, ValueError):  # not written yet, or half written
        return None


def kill_peer(out: Path, rank: int) -> None:
    record = out / f"trainer-{rank}.json"
    pid = wait_for(f"{record}", lambda: recorded_pid(record))
    os.kill(pid, signal.SIGKILL)
    wait_for(f"rank {rank} (pid {pid}) to die", lambda: pid_dead(pid))


def attach_to_mps() -> None:
    """What CUDA's start does under MPS, for the stand-in daemon: register this process as a client."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if pipe and Path(pipe, "control").exists():
        with open(Path(pipe) / "clients", "a") as f:
            f.write(f"{os.getpid()}\n")


def log_like_a_trainer() -> None:
    """Lines of each kind a real trainer prints, for the console filter (launcher/console.py):
    a per-step engine record, a run event, a warning and a progress line."""
    import logging

    from areal.infra.log_format import setup_process_logging

    setup_process_logging()
    logging.getLogger("areal.fsdp").info("weight update v1 (disk): 0.05 s, 1.9 MB")
    logging.getLogger("areal.trainer").info("step 1: checkpoint saved to checkpoints/step_00000001")
    logging.getLogger("areal.engine.sglang.client").warning("a warning the console shows")
    sys.stderr.flush()
    print("step 1/1 | reward 0.500 | loss 0.100", flush=True)


def wait_until_served(config: str, addrs: list[str], record: Path, timeout: float = 120.0) -> None:
    """As the real client does: the launcher starts trainers with the servers it runs, so wait
    until each answers /health; then until it has published them (once it saw them answer).
    Servers it does not run (rollout.server_addrs of a trainer-only run) are not waited for."""
    import yaml

    if not yaml.safe_load(Path(config).read_text())["launcher"]["rollout_n_nodes"]:
        return
    deadline = time.monotonic() + timeout
    while addrs and not (all(healthy(a) for a in addrs) and record.exists()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"fake trainer: {addrs} not healthy and published in {record} within {timeout} s")
        time.sleep(0.1)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    args = p.parse_args()
    env = os.environ
    attach_to_mps()
    rank = int(env.get("RANK", "0"))
    role = "trainer" if "RANK" in env else "driver"
    addrs = [a for a in env.get("AREAL_SERVER_ADDRS", "").split(",") if a]
    out = Path(env["AREAL_RUN_DIR"]) / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{role}-{rank}.started").touch()
    if env.get("FAKE_EXIT_AT_START"):  # fails in its own start-up (a bad dataset path, say)
        print(f"{role} {rank} failing at its start", flush=True)
        return int(env["FAKE_EXIT_AT_START"])
    record = Path(env["AREAL_RUN_DIR"]) / "name_resolve" / "servers.json"
    wait_until_served(args.config, addrs, record)
    info = {
        "pid": os.getpid(),
        "env": {k: env.get(k) for k in ENV_KEYS},
        "config_exists": Path(args.config).is_file(),
        "cwd": os.getcwd(),
        "healthy": {a: healthy(a) for a in addrs},
        "record": json.loads(record.read_text()) if record.exists() else None,
        "grandchild": spawn_sleeper() if env.get("FAKE_SPAWN_CHILD") else None,
    }
    if env.get("FAKE_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (out / f"{role}-{rank}.json").write_text(json.dumps(info))
    print(f"{role} {rank} of {env.get('WORLD_SIZE')} up; servers {addrs}", flush=True)
    if env.get("FAKE_FAIL_RANK") == str(rank):
        time.sleep(float(env.get("FAKE_FAIL_AFTER_S", "0")))
        print(f"rank {rank} failing on purpose", flush=True)
        return int(env.get("FAKE_EXIT", "3"))
    peer = env.get("FAKE_KILL_PEER")
    if peer is not None and peer != str(rank):
        kill_peer(out, int(peer))
        print(f"rank {rank}: peer rank {peer} died", flush=True)
        return int(env.get("FAKE_EXIT", "3"))
    if env.get("FAKE_STOP_RANK") == str(rank):
        print(f"rank {rank} stopping itself", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    until = env.get("FAKE_UNTIL_RESTARTED")
    if until and not started_twice(Path(env["AREAL_RUN_DIR"]), until):
        print(f"{until} was never restarted", flush=True)
        return 1
    if env.get("FAKE_PHASE") and role == "trainer":
        (Path(env["AREAL_RUN_DIR"]) / "logs" / f"trainer-{rank}.phase").write_text("step 1 rollout\n")
    wait_file = env.get("FAKE_WAIT_FILE")
    if wait_file:
        try:
            wait_for(wait_file, lambda: Path(wait_file).exists())
        except TimeoutError as e:
            print(e, flush=True)
            return 1
    time.sleep(float(env.get("FAKE_SLEEP_S", "0")))
    log_like_a_trainer()
    print(f"{role} {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
