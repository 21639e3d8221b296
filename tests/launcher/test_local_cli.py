"""`areal-launch` as users run it (a subprocess from the repo root): a full run with the real
built-in server, failures, and Ctrl-C / SIGTERM tearing everything down."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time

from tests.launcher.helpers import REPO, all_pids, outputs, repo_env, run_dir_of, wait_gone, write_yaml

LAUNCH = [sys.executable, "-m", "launcher.cli"]
HANG_GUARD_S = 120  # launcher.wait bounds only stop a hang: fake trainers here sleep 300 s


class Launcher:
    """A launcher subprocess whose output is collected by a thread (so pipes never fill up)."""

    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen(
            args, cwd=REPO, env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(re.search(pattern, line) for line in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r}; output:\n{self.output}")

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def started_pids(self) -> list[int]:
        return [int(m) for m in re.findall(r"started \S+ .*\(pid (\d+)\)", self.output)]


def test_full_run_with_builtin_server(tmp_path, tiny_model_dir):
    cfg = write_yaml(tmp_path / "exp.yaml", fileroot=tmp_path / "runs", model=tiny_model_dir)
    launcher = Launcher([*LAUNCH, "--config", cfg])
    assert launcher.wait(300) == 0, launcher.output
    run_dir = run_dir_of(tmp_path / "runs")
    out = outputs(run_dir)
    assert set(out) == {"trainer-0", "trainer-1"}
    addrs = out["trainer-0"]["env"]["AREAL_SERVER_ADDRS"].split(",")
    assert len(addrs) == 1 and out["trainer-1"]["healthy"] == {addrs[0]: True}
    assert out["trainer-0"]["record"] == {"addrs": addrs}
    assert {o["env"]["RANK"] for o in out.values()} == {"0", "1"}
    assert "[server-0] The server is fired up" in launcher.output
    assert "fired up" in (run_dir / "logs" / "server-0.log").read_text()
    assert (run_dir / "config.yaml").exists() and (run_dir / "plan.json").exists()
    assert wait_gone(launcher.started_pids()) == []


def test_failure_exit_code_and_report(tmp_path):
    cfg = write_yaml(
        tmp_path / "exp.yaml",
        fileroot=tmp_path / "runs",
        rollout_nodes=0,
        trainer_env={"FAKE_FAIL_RANK": "0", "FAKE_EXIT": "7", "FAKE_SLEEP_S": "300", "FAKE_SPAWN_CHILD": "1"},
    )
    launcher = Launcher([*LAUNCH, "--config", cfg, "rollout.server_addrs=[127.0.0.1:1]"])
    assert launcher.wait(HANG_GUARD_S) == 7
    assert "error: trainer-0 exited with code 7; log: " in launcher.output
    assert wait_gone(all_pids(run_dir_of(tmp_path / "runs"))) == []


def _signal_teardown(tmp_path, sig: int) -> tuple[int, str]:
    cfg = write_yaml(
        tmp_path / "exp.yaml",
        fileroot=tmp_path / "runs",
        rollout_nodes=0,
        trainer_env={"FAKE_SLEEP_S": "300", "FAKE_SPAWN_CHILD": "1", "FAKE_IGNORE_TERM": "1"},
    )
    launcher = Launcher([*LAUNCH, "--config", cfg, "rollout.server_addrs=[127.0.0.1:1]"])
    for rank in (0, 1):
        launcher.wait_for(rf"\[trainer-{rank}\] trainer {rank} of 2 up")
    launcher.proc.send_signal(sig)
    rc = launcher.wait(HANG_GUARD_S)
    pids = all_pids(run_dir_of(tmp_path / "runs"))
    assert len(pids) == 4 and wait_gone(pids) == []
    # stopped (SIGKILL after the grace: they ignore SIGTERM), not waited out
    assert not re.search(r"trainer \d done", launcher.output), launcher.output
    return rc, launcher.output


def test_sigterm_tears_everything_down(tmp_path):
    rc, output = _signal_teardown(tmp_path, signal.SIGTERM)
    assert rc == 143, output
    assert "SIGTERM received: stopping every process" in output


def test_ctrl_c_tears_everything_down(tmp_path):
    rc, output = _signal_teardown(tmp_path, signal.SIGINT)
    assert rc == 130, output


def test_keep_servers_until_ctrl_c(tmp_path):
    """Inference-only with launcher.keep_servers: the driver finishes, servers stay until Ctrl-C."""
    launcher = Launcher(
        [
            sys.executable,
            "-m",
            "tests.launcher.run_plan",
            str(tmp_path),
            "launcher.trainer_n_nodes=0",
            "launcher.keep_servers=true",
        ]
    )
    launcher.wait_for(r"press Ctrl-C to stop them")
    run_dir = next(tmp_path.glob("*/*/out"))
    server_pids = [v["pid"] for k, v in outputs(run_dir.parent).items() if k.startswith("server")]
    assert "driver-0 finished" in launcher.output and wait_gone(server_pids, timeout=0.5) == server_pids
    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.wait(HANG_GUARD_S) == 0, launcher.output
    assert wait_gone(server_pids) == []


def test_children_die_with_a_killed_launcher(tmp_path):
    """Even a SIGKILLed launcher (no teardown possible) takes its servers and trainers along."""
    launcher = Launcher(
        [sys.executable, "-m", "tests.launcher.run_plan", str(tmp_path), '+launcher.trainer_env.FAKE_SLEEP_S="300"']
    )
    for rank in (0, 1):
        launcher.wait_for(rf"\[trainer-{rank}\] trainer {rank} of 2 up")
    pids = launcher.started_pids()
    assert len(pids) == 3
    launcher.proc.kill()
    launcher.wait(10)
    assert wait_gone(pids, timeout=10) == []
