"""Faults injected into real runs: `areal-launch` with the built-in server and real trainer workers
on the CPU demo task (tiny:arith, a few steps of 8 prompts).

  server SIGKILLed, then SIGSTOPped, with launcher.restart_failed_servers=true: restarted each
      time with the current weights, the run completes every step; without it, a SIGKILLed
      server stops everything and the error names it and its log;
  trainer rank SIGKILLed (fsdp:d2): everything stops, the last checkpoint is intact
      and a second areal-launch with recover.mode=auto resumes from it and completes the run,
      on the prompts of a run never killed (also with rollout.dynamic_sampling, synchronous);
  server SIGSTOPped: the health watch names it after launcher.server_health_timeout_s, or
      after launcher.server_startup_timeout_s while no trainer rank has begun a step;
  SIGINT to areal-launch: every process it started, grandchildren included, is gone.

A disk that fills up during a checkpoint is tested in tests/trainer/test_checkpoint.py.
How long each stop takes is printed ([measured], with pytest -s) for docs/reliability.md, never
asserted: a busy machine's timings are not the launcher's behaviour.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.launcher.helpers import REPO, free_ports, wait_gone
from tests.launcher.test_local_cli import LAUNCH, Launcher

pytestmark = pytest.mark.slow
HANG_GUARD_S = 180  # bounds a stopping launcher's wait only against a hang (runs here have 200 steps)


class TimedLauncher(Launcher):
    """A Launcher that also notes when each console line arrived (for the measured numbers)."""

    def __init__(self, args: list[str]):
        self.times: list[float] = []
        super().__init__(args)

    def _read(self):
        for line in self.proc.stdout:
            self.times.append(time.monotonic())
            self.lines.append(line.rstrip("\n"))

    def seconds_to(self, pattern: str, since: float) -> float:
        """Seconds from `since` to the first line matching pattern that came after it."""
        return next(t for t, line in zip(self.times, self.lines) if t >= since and re.search(pattern, line)) - since


def measured(what: str, seconds: float) -> None:
    print(f"[measured] {what}: {seconds:.1f} s")  # shown with pytest -s


def launch(fileroot, *overrides: str) -> TimedLauncher:
    """areal-launch on the CPU demo, small: batches of 8 prompts, no evaluation, no plot."""
    return TimedLauncher(
        [
            *LAUNCH,
            "--config",
            "tiny_arith_cpu.yaml",
            f"cluster.fileroot={fileroot}",
            "train_dataset.batch_size=8",
            "evaluator.freq_steps=null",
            "saver.save_at_end=false",
            "stats_logger.progress_bar=false",
            "stats_logger.plot=false",
            f"launcher.server_base_port={free_ports(2)}",
            f"launcher.trainer_master_port={free_ports(1)}",
            "launcher.shutdown_grace_s=3",
            *overrides,
        ]
    )


def run_dir_of(fileroot) -> Path:
    return Path(fileroot) / "tiny_arith_cpu" / "demo"


def rows(run_dir) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_rows(launcher: Launcher, run_dir, n: int, timeout: float = 240) -> None:
    """Until metrics.jsonl has n rows (n training steps done)."""
    deadline = time.monotonic() + timeout
    while len(rows(run_dir)) < n:
        assert launcher.proc.poll() is None, f"the run ended early:\n{launcher.output}"
        assert time.monotonic() < deadline, f"fewer than {n} steps after {timeout} s:\n{launcher.output}"
        time.sleep(0.2)


def pid_of(launcher: Launcher, name: str) -> int:
    """The pid of the latest start of process `name`, from the launcher's console."""
    return int(re.findall(rf"started {name} \(pid (\d+)\)", launcher.output)[-1])


def stopped(launcher: Launcher) -> tuple[int, float]:
    """(exit code, seconds from now) of a launcher that must stop by itself."""
    t0 = time.monotonic()
    rc = launcher.wait(HANG_GUARD_S)
    return rc, time.monotonic() - t0


def tree_pids(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def test_killed_or_hung_server_restarts_with_current_weights(tmp_path):
    """launcher.restart_failed_servers: the server is SIGKILLed after step 3, then SIGSTOPped
    after step 6 (the health watch finds it); each time it comes back serving the trainer's last
    weight update and the run completes all 10 steps."""
    launcher = launch(
        tmp_path, "total_train_steps=10", "launcher.restart_failed_servers=true", "launcher.server_health_timeout_s=5"
    )
    run_dir = run_dir_of(tmp_path)
    wait_rows(launcher, run_dir, 3)
    t_kill = time.monotonic()
    os.kill(pid_of(launcher, "server-0"), signal.SIGKILL)
    first = restarted(launcher, r"was killed by SIGKILL \(exit code 137\)", 1)
    measured("server SIGKILL -> restarted server healthy", launcher.seconds_to("server-0 is back", t_kill))
    wait_rows(launcher, run_dir, 6)
    hung = pid_of(launcher, "server-0")
    t_stop = time.monotonic()
    os.kill(hung, signal.SIGSTOP)
    try:
        second = restarted(
            launcher,
            r"did not answer http://\S+/health for \d+ s "
            r"\(launcher.server_health_timeout_s=5\): it is hung or stopped",
            2,
        )
    finally:
        if psutil.pid_exists(hung):
            os.kill(hung, signal.SIGCONT)
    measured(
        "server SIGSTOP -> named by the health watch (timeout 5 s)",
        launcher.seconds_to("server-0 did not answer", t_stop),
    )
    measured("server SIGSTOP -> restarted server healthy", launcher.seconds_to("server-0 is back", t_stop))
    assert launcher.wait(300) == 0, launcher.output

    assert 3 <= first["version"] and 6 <= second["version"]
    for r in (first, second):
        assert r["folder"] == str(run_dir / "weight_update" / f"v{r['version']}")
        assert r["served"] >= r["version"]  # back with the trainer's weights (a later push may follow)
    log = (run_dir / "logs" / "server-0.log").read_text()
    banners = [line for line in log.splitlines() if line.startswith("=== server-0 started")]
    assert len(banners) == 3
    for banner, r in zip(banners[1:], (first, second)):
        assert f"--model-path {r['folder']}" in banner and f"--weight-version {r['version']}" in banner
    steps = rows(run_dir)
    assert [r["step"] for r in steps] == list(range(1, 11))  # the same steps as without a fault
    assert steps[-1]["weight_version"] == 10
    assert wait_gone([int(p) for p in re.findall(r"\(pid (\d+)\)", launcher.output)]) == []


def restarted(launcher: Launcher, reason: str, nth: int) -> dict:
    """The nth restart of server-0 for `reason`: the weights it was given, and the weight version
    it reports as soon as it is back."""
    deadline = time.monotonic() + 180
    while launcher.output.count("[launcher] server-0 is back at") < nth:
        assert launcher.proc.poll() is None and time.monotonic() < deadline, launcher.output
        time.sleep(0.1)
    found = re.search(
        rf"server-0 {reason}; restarting it at (\S+) with weight version (\d+) \((\S+)\) "
        rf"\({nth}/3, launcher.restart_failed_servers=true\)",
        launcher.output,
    )
    assert found, launcher.output
    served = requests.get(f"http://{found.group(1)}/model_info", timeout=10).json()["weight_version"]
    return {"version": int(found.group(2)), "folder": found.group(3), "served": int(served)}


def test_killed_server_without_fault_tolerance_stops_everything(tmp_path):
    launcher = launch(tmp_path, "total_train_steps=200")
    run_dir = run_dir_of(tmp_path)
    wait_rows(launcher, run_dir, 2)
    kill_stops_everything(launcher, run_dir, "server-0")


def kill_stops_everything(launcher: Launcher, run_dir, name: str) -> None:
    """SIGKILL process `name`: the run stops, exit code 137, the error names the process and its
    log, and no process of the run is left."""
    pids = tree_pids(launcher.proc.pid)
    os.kill(pid_of(launcher, name), signal.SIGKILL)
    rc, seconds = stopped(launcher)
    measured(f"{name} SIGKILL -> every process stopped, launcher exited", seconds)
    assert rc == 137, launcher.output
    log = run_dir / "logs" / f"{name}.log"
    assert f"error: {name} was killed by SIGKILL (exit code 137); log: {log}" in launcher.output
    assert wait_gone(pids) == []


def stop_past_a_checkpoint(launcher: Launcher, run_dir, min_rows: int, timeout: float = 240) -> None:
    """SIGSTOP trainer-0 once metrics.jsonl holds min_rows rows and a step past the newest complete
    checkpoint, so a rank killed then leaves logged steps to redo. Rank 0 logs each row and
    completes each checkpoint (its rename of step_N.tmp), so while it is stopped neither moves;
    a kill that lands right after a checkpoint would leave none (seen once, when the test killed
    at 3 rows straight away). The launcher continues the stopped rank as it stops the run."""
    from areal.trainer.checkpoint import load_latest

    deadline = time.monotonic() + timeout
    while True:
        wait_rows(launcher, run_dir, min_rows, max(1.0, deadline - time.monotonic()))
        pid = pid_of(launcher, "trainer-0")  # started by now: it logged the rows
        os.kill(pid, signal.SIGSTOP)
        latest = load_latest(run_dir)
        done, saved = len(rows(run_dir)), (latest[1].step if latest else 0)
        if done > saved:
            return
        os.kill(pid, signal.SIGCONT)
        min_rows = done + 1


def test_killed_trainer_rank_stops_everything_and_recover_resumes(tmp_path):
    two_ranks = ["actor.backend=fsdp:d2", "cluster.n_gpus_per_node=3", "total_train_steps=6", "recover.freq_steps=2"]
    # the run never killed goes on beside the others: which prompts it trains on does not depend on timing
    straight = launch(tmp_path / "straight", *two_ranks)
    launcher = launch(tmp_path, *two_ranks)
    run_dir = run_dir_of(tmp_path)
    stop_past_a_checkpoint(launcher, run_dir, 3)  # the step-2 checkpoint is written before step 3 starts
    kill_stops_everything(launcher, run_dir, "trainer-1")

    from areal.trainer.checkpoint import load_latest

    folder, state = load_latest(run_dir)  # complete: trainer_state.json is written last
    assert state.step >= 2 and state.step % 2 == 0 and state.weight_version == state.step
    assert sorted(p.name for p in (folder / "rng").iterdir()) == ["rank0.pt", "rank1.pt"]
    done_before = len(rows(run_dir))

    t0 = time.monotonic()
    resumed = launch(tmp_path, *two_ranks, "recover.mode=auto")
    assert resumed.wait(300) == 0, resumed.output
    measured(f"resumed run (recover.mode=auto, steps {state.step + 1}-6)", time.monotonic() - t0)
    assert f"recovered from {folder}: resuming at step {state.step + 1}" in resumed.output
    steps = [r["step"] for r in rows(run_dir)]
    assert done_before > state.step  # the killed run had logged steps past its checkpoint...
    assert steps == sorted(set(steps)) and set(range(1, 7)) <= set(steps)  # ...redone once each
    assert steps[-1] == 6 and rows(run_dir)[-1]["weight_version"] == 6  # final step as configured

    # no prompt lost or doubled: the same prompts as a run that was never killed
    from areal.trainer.prompt_log import compare_prompts, read_prompts

    assert straight.wait(300) == 0, straight.output
    baseline = run_dir_of(tmp_path / "straight")
    assert compare_prompts(baseline, run_dir, steps=range(1, 7)) == []
    assert read_prompts(run_dir) == read_prompts(baseline)  # even step by step: batches are in order


def test_dynamic_sampling_run_resumes_on_the_prompts_of_an_uninterrupted_run(tmp_path):
    """rollout.dynamic_sampling drops groups of equal rewards and draws more prompts, so which
    records a step trains on depends on what was sampled. A run killed after a checkpoint and
    recovered still trains on the prompts of a run that was never killed, step by step, with
    the same losses bit for bit (the checkpoint restores weights, optimizer and data position
    exactly). What is sampled must depend on the data and the weights alone, not on timing:
    synchronous (max_head_offpolicyness=0), sampling seeds, max_overgeneration out of reach
    (past it groups are kept in the order they finish), and one sequence at a time on the
    server: a batched forward pass changes a row's logprobs in their last bits, which moved a
    group across the zero-variance line two steps after a resume
    (tests/trainer/test_sync_equals_async.py explains the server's part)."""
    sync = [
        "rollout.dynamic_sampling=true",
        "rollout.max_head_offpolicyness=0",
        "rollout.max_overgeneration=1000",
        "sglang.max_running_requests=1",
        "total_train_steps=5",
        "recover.freq_steps=2",
    ]
    straight = launch(tmp_path / "straight", *sync)  # beside the others: nothing here depends on timing
    launcher = launch(tmp_path, *sync)
    run_dir = run_dir_of(tmp_path)
    wait_rows(launcher, run_dir, 3)  # the step-2 checkpoint is written before step 3 starts
    kill_stops_everything(launcher, run_dir, "trainer-0")
    resumed = launch(tmp_path, *sync, "recover.mode=auto")
    assert resumed.wait(300) == 0, resumed.output
    assert "resuming at step" in resumed.output

    from areal.trainer.prompt_log import read_prompts

    assert straight.wait(300) == 0, straight.output
    baseline = run_dir_of(tmp_path / "straight")
    assert [r["step"] for r in rows(run_dir)] == [1, 2, 3, 4, 5]
    assert read_prompts(run_dir) == read_prompts(baseline)
    assert [r["train/loss"] for r in rows(run_dir)] == [r["train/loss"] for r in rows(baseline)]
    assert [r["weight_version"] for r in rows(run_dir)] == [1, 2, 3, 4, 5]
    # the filter did drop groups, so later steps trained on records beyond step x batch
    assert any(r["rollout/dropped_groups_frac"] > 0 for r in rows(baseline)), rows(baseline)


def test_stopped_server_is_named_by_the_health_check(tmp_path):
    launcher = launch(tmp_path, "total_train_steps=200", "launcher.server_health_timeout_s=5")
    run_dir = run_dir_of(tmp_path)
    wait_rows(launcher, run_dir, 1)
    pids = tree_pids(launcher.proc.pid)
    server = pid_of(launcher, "server-0")
    t_stop = time.monotonic()
    os.kill(server, signal.SIGSTOP)
    try:
        rc, seconds = stopped(launcher)
    finally:
        if psutil.pid_exists(server):
            os.kill(server, signal.SIGCONT)
    measured(
        "server SIGSTOP -> named by the health watch (timeout 5 s)",
        launcher.seconds_to("server-0 did not answer", t_stop),
    )
    measured("server SIGSTOP -> every process stopped, launcher exited", seconds)
    assert rc == 1, launcher.output
    noticed = launcher.output.index("server-0 has not answered /health for")  # at half the timeout
    assert noticed < launcher.output.index("error: server-0 did not answer"), launcher.output
    found = re.search(
        r"error: server-0 did not answer http://127\.0\.0\.1:\d+/health for (\d+) s "
        r"\(launcher\.server_health_timeout_s=5\): it is hung or stopped; .*; log: (\S+)",
        launcher.output,
    )
    assert found and int(found.group(1)) >= 5, launcher.output
    assert found.group(2) == str(run_dir / "logs" / "server-0.log")
    assert wait_gone(pids) == []


def test_server_silent_before_the_first_step_gets_the_startup_timeout(tmp_path):
    """Until a trainer rank begins its first step the servers are still starting: the trainer's
    warm-up makes SGLang compile kernels with /health unanswered (over a minute on a fresh GPU).
    A server silent then is judged by launcher.server_startup_timeout_s (20 s here), not by
    launcher.server_health_timeout_s (2 s): stopped as soon as it is ready and resumed once the
    launcher has named it (at half the startup timeout), the run goes on and completes. The trainer
    starts with the server, so a gate holds it in its start-up (a sitecustomize that waits for a
    file) until the server is resumed: no step can begin before."""
    gate = tmp_path / "trainer_may_start"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, time\n"
        f"deadline = time.monotonic() + {HANG_GUARD_S}\n"
        f"while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )
    launcher = launch(
        tmp_path,
        "total_train_steps=2",
        "launcher.server_health_timeout_s=2",
        "launcher.server_startup_timeout_s=20",
        "launcher.stopped_timeout_s=null",
        f"+launcher.trainer_env.PYTHONPATH={hook}:{REPO}",
    )
    try:
        launcher.wait_for("servers ready")
        server = pid_of(launcher, "server-0")
        os.kill(server, signal.SIGSTOP)
        try:
            launcher.wait_for("server-0 has not answered /health for", timeout=60)
        finally:
            os.kill(server, signal.SIGCONT)
    finally:
        gate.touch()
    assert launcher.wait(HANG_GUARD_S) == 0, launcher.output
    notice = next(line for line in launcher.lines if "server-0 has not answered /health for" in line)
    assert "launcher.server_startup_timeout_s=20 (no trainer rank has begun its first step yet)" in notice
    assert "did not answer" not in launcher.output and "restarting" not in launcher.output
    assert "server-0 answers /health again" in launcher.output
    assert len(rows(run_dir_of(tmp_path))) == 2


def test_ctrl_c_to_launcher_stops_every_process(tmp_path):
    """SIGINT (Ctrl-C); SIGTERM takes the same path (test_local_cli.py tests both on fake trainers)."""
    sig = signal.SIGINT
    launcher = launch(tmp_path, "total_train_steps=200")
    wait_rows(launcher, run_dir_of(tmp_path), 1)
    children = psutil.Process(launcher.proc.pid).children()
    grandchildren = [p.pid for c in children for p in c.children(recursive=True)]
    assert {c.pid for c in children} == {pid_of(launcher, "server-0"), pid_of(launcher, "trainer-0")}
    assert grandchildren, "the trainer's reward workers should be grandchildren of the launcher"
    launcher.proc.send_signal(sig)
    rc, seconds = stopped(launcher)
    measured(f"{sig.name} -> every process stopped, launcher exited", seconds)
    assert rc == 128 + sig, launcher.output
    assert f"{sig.name} received: stopping every process" in launcher.output
    assert wait_gone([c.pid for c in children] + grandchildren) == []
