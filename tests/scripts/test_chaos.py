"""scripts/chaos.py in CI: 5 seeded trials on the CPU demo (4 steps each, no relaunch) that strike
every kind of process of a run (the launcher, the server, trainer ranks 0 and 1 of fsdp:d2, a
reward worker) at each moment (generation, training, weight update, checkpoint write,
evaluation), with SIGKILL and SIGSTOP.

Seed 5 draws: launcher SIGKILL at a weight update, server SIGKILL at a checkpoint write,
trainer-1 SIGSTOP in training, trainer-0 SIGSTOP in generation, reward worker SIGKILL in an
evaluation (a sixth trial, trainer-0 SIGSTOP in an evaluation, struck no new kind and was dropped
to keep the suite under 20 minutes). Each must end in a completed run (steps 1..4 once
each in metrics.jsonl and prompts.jsonl) or in every process exiting within 60 s with an error
naming the process and its log; never a hang, never a process left behind. The relaunch with
recover.mode=auto is left to the full script (docs/reliability.md) and tests/launcher/test_faults.py.
A stopped process may stay stopped 5 s (launcher.stopped_timeout_s; the script's default is 10):
a process is only ever in that state when signalled, so the shorter wait cannot misfire.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chaos.py"


def _load_chaos(monkeypatch):
    spec = importlib.util.spec_from_file_location("chaos", SCRIPT)
    chaos = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "chaos", chaos)  # its dataclass looks itself up there
    spec.loader.exec_module(chaos)
    return chaos


@pytest.mark.slow
def test_five_chaos_trials_end_in_recovery_or_a_named_exit(tmp_path, monkeypatch):
    chaos = _load_chaos(monkeypatch)
    args = chaos.parse_args(
        [
            "--trials",
            "5",
            "--seed",
            "5",
            "--steps",
            "4",
            "--no-relaunch",
            "--stopped-timeout",
            "5",
            "--root",
            str(tmp_path),
        ]
    )
    results = chaos.run_trials(args)
    table = "\n".join(f"{r.target} {r.moment} {r.signal}: {r.outcome} ({r.seconds:.1f} s) {r.note}" for r in results)
    print(table)  # shown with pytest -s
    assert {r.target for r in results} == set(chaos.PRESETS["demo"].targets), table
    assert {r.moment for r in results} == set(chaos.MOMENTS), table
    assert {r.signal for r in results} == set(chaos.SIGNALS), table
    for r in results:
        assert not chaos.failed(r), table
        assert r.outcome in ("completed", "clean exit", "all exited"), table
        if r.outcome != "completed":
            assert r.seconds <= chaos.EXIT_WITHIN_S, table


# ids not named "gpu": a keyword "gpu" would skip the test as GPU-marked (tests/conftest.py)
@pytest.mark.parametrize(
    "name", ["demo", "colocated", "workers", "agent", "gpu", "gpu_sync"], ids=lambda n: f"preset_{n}"
)
def test_each_preset_runs_where_the_trials_watch_it(name, tmp_path, monkeypatch):
    """The trials read metrics.jsonl and the phase files under chaos.run_dir_of; the launcher's own
    plan of the trial's command must put the run there (the GPU presets' config names its trial
    trial0, and the trials once waited for steps under .../demo). The GPU presets are planned with
    the built-in server: SGLang is not installed on CPU, and the server does not move the run."""
    import json
    import subprocess

    chaos = _load_chaos(monkeypatch)
    preset = chaos.PRESETS[name]
    args = chaos.launch_args(tmp_path, 4, [], None, preset, (31000, 31010))
    args = [a.replace("rollout.server=sglang", "rollout.server=builtin") for a in args]
    out = subprocess.run([*args, "--dry-run", "--json"], cwd=chaos.REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    plan = json.loads(out.stdout)
    assert plan["run_dir"] == str(chaos.run_dir_of(tmp_path, preset))
    assert {p["env"]["AREAL_RUN_DIR"] for p in plan["processes"]} == {plan["run_dir"]}


def test_a_trial_run_keeps_the_callers_python_path(monkeypatch):
    """On the device SGLang lives in a folder named by PYTHONPATH; a run that lost it died at import
    (pydantic, then sglang) before its first step."""
    import os

    chaos = _load_chaos(monkeypatch)
    env = chaos.run_env({"PYTHONPATH": "/tmp/site", "OMP_NUM_THREADS": "1", "HOME": "/root"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(chaos.REPO), "/tmp/site"]
    assert "OMP_NUM_THREADS" not in env and env["HOME"] == "/root"
    assert chaos.run_env({})["PYTHONPATH"] == str(chaos.REPO)


def test_a_server_restart_under_way_gives_the_run_the_start_deadline(monkeypatch):
    """A restarted SGLang server takes over a minute to answer on a GPU (the launcher's lines from a
    device trial, 2026-12-05): the trial waits for its start, not STALL_S, until it is back."""
    chaos = _load_chaos(monkeypatch)
    begun = (
        "[launcher] server-0 has had its process pid 3898 (sglang::scheduler) in the stopped state (SIGSTOP) "
        "for 10 s (launcher.stopped_timeout_s=10): the run cannot go on without it; restarting it at "
        "127.0.0.1:30157 with weight version 2 (/tmp/chaos2/trial-1-0/weight_update/v2) "
        "(1/3, launcher.restart_failed_servers=true)\n"
        "[launcher] started server-0 (pid 4078); log: /tmp/chaos2/trial-1-0/logs/server-0.log\n"
    )
    back = "[launcher] server-0 is back at 127.0.0.1:30157\n"
    assert not chaos.restart_under_way("[trainer-0] step 2/6 | reward 0.172\n")
    assert chaos.restart_under_way(begun)
    assert not chaos.restart_under_way(begun + back)
    assert chaos.restart_under_way(begun + back + begun.replace("1/3", "2/3"))


def test_a_trial_that_was_not_delivered_says_how_often_the_server_was_restarted(monkeypatch):
    """The 40-step GPU trial of 2026-12-06 never reached its moment: the launcher had restarted its
    server three times in the warm-up. The trial's note says so, with the first reason."""
    chaos = _load_chaos(monkeypatch)
    line = (
        "[launcher] server-0 did not answer http://127.0.0.1:21104/health for 60 s "
        "(launcher.server_health_timeout_s=60): it is hung or stopped; restarting it at 127.0.0.1:21104 with "
        "the initial model (no disk weight update recorded yet) ({k}/3, launcher.restart_failed_servers=true)"
    )
    console = "\n".join([line.format(k=1), "[launcher] server-0 is back at 127.0.0.1:21104", line.format(k=2)])
    assert chaos.restarts_said("[trainer-0] step 2/6 | reward 0.172") == ""
    assert chaos.restarts_said(console) == (
        "; the launcher restarted a server 2 time(s) before, first: server-0 did not answer "
        "http://127.0.0.1:21104/health for 60 s (launcher.server_health_timeout_s=60): it is hung or stopped"
    )
