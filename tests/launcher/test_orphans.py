"""No orphans: when `areal-launch` itself is SIGKILLed (no teardown runs), every process of the
run goes too: the server and the trainer through the parent-death signal the launcher sets on
its children (launcher/procs.py), the trainer's reward workers through their parent watch
(areal/reward/runner.py). Processes are found by the run's marker (AREAL_CONFIG=RUN/config.yaml
in their environment), not by parentage: orphans are reparented and would drop out of a tree.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from launcher.procs import run_processes
from tests.launcher.test_faults import launch, measured, run_dir_of, wait_rows

pytestmark = pytest.mark.slow
GONE_WITHIN_S = 60.0


def describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"pid {p.pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            out.append(f"pid {p.pid} (gone while listing)")
    return "\n".join(out)


def wait_no_run_processes(config: str, timeout: float) -> list[psutil.Process]:
    """Poll until no process of the run is left; returns the survivors after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = run_processes(config)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_sigkilled_launcher_leaves_no_process_of_its_run(tmp_path):
    launcher = launch(tmp_path, "total_train_steps=200")
    run_dir = run_dir_of(tmp_path)
    config = str(run_dir / "config.yaml")
    try:
        wait_rows(launcher, run_dir, 1)  # servers, trainer and reward workers are all up
        procs = run_processes(config, exclude=(launcher.proc.pid,))
        trainer = next(p for p in procs if "areal.trainer.main" in " ".join(p.cmdline()))
        kinds = {
            "server": any("areal.server" in " ".join(p.cmdline()) for p in procs),
            "trainer": True,
            "reward worker": any(p.ppid() == trainer.pid for p in procs),
        }
        assert all(kinds.values()), f"expected every kind of process of the run: {kinds}\n{describe(procs)}"
        t_kill = time.monotonic()
        launcher.proc.send_signal(signal.SIGKILL)
        launcher.wait(30)
        left = wait_no_run_processes(config, GONE_WITHIN_S)
        survivors = describe(left)  # before the cleanup below kills them
        measured("launcher SIGKILL -> no process of the run left", time.monotonic() - t_kill)
    finally:
        for p in run_processes(config):  # whatever a failure left behind: not for later tests
            try:
                os.kill(p.pid, signal.SIGKILL)
            except OSError:
                pass
    assert not left, f"processes of the run outlived the SIGKILLed launcher by {GONE_WITHIN_S:g} s:\n{survivors}"
