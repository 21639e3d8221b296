"""A trainer rank that stops making progress is named, and the run ends: no silent hang.

Real runs (`areal-launch` on the CPU demo, built-in server, fsdp:d2 trainer workers); trainer
rank 1 is SIGSTOPped after step 1 and never resumed.

  launcher.stopped_timeout_s: the launcher sees trainer-1 in the stopped state and fails the run
      naming it, the key and its log;
  actor.collective_timeout_s (the stopped check off): trainer-0 waits for trainer-1 in a
      collective, gloo gives up after the timeout, and the launcher's error names the key and
      trainer-1 as stopped.
  launcher.trainer_phase_timeout_s (one rank; the stopped and health checks off): the server is
      SIGSTOPped instead, so the running trainer blocks in its phase, which the launcher names.

Every process of the run must be gone within 60 s of the detection. Times are printed
([measured], pytest -s), and asserted only against the configured timeouts.
"""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from tests.launcher.helpers import wait_gone
from tests.launcher.test_faults import launch, measured, pid_of, run_dir_of, tree_pids, wait_rows

pytestmark = pytest.mark.slow
TWO_RANKS = ["actor.backend=fsdp:d2", "cluster.n_gpus_per_node=3", "total_train_steps=200"]
EXIT_WITHIN_S = 60  # every process of the run gone this long after the detection (issue 30)


def stop_trainer_1(tmp_path, *overrides: str):
    """Start the run, SIGSTOP trainer-1 after step 1; (launcher, run dir, stopped pid, time, pids)."""
    launcher = launch(tmp_path, *TWO_RANKS, *overrides)
    run_dir = run_dir_of(tmp_path)
    wait_rows(launcher, run_dir, 1)
    pids = tree_pids(launcher.proc.pid)
    rank1 = pid_of(launcher, "trainer-1")
    t_stop = time.monotonic()
    os.kill(rank1, signal.SIGSTOP)
    return launcher, run_dir, rank1, t_stop, pids


def ends_naming(
    launcher, stopped_pid: int, t_stop: float, pids: list[int], pattern: str, within_s: float, what: str = "trainer-1"
) -> re.Match:
    """The launcher exits 1 with an error matching pattern, printed within_s after the SIGSTOP,
    and then every process of the run is gone within EXIT_WITHIN_S; `what` was SIGSTOPped."""
    try:
        rc = launcher.wait(within_s + EXIT_WITHIN_S + 30)
    finally:
        if psutil.pid_exists(stopped_pid):
            os.kill(stopped_pid, signal.SIGCONT)
    assert rc == 1, launcher.output
    found = re.search(pattern, launcher.output)
    assert found, launcher.output
    named = launcher.seconds_to(re.escape(found.group(0)[:40]), t_stop)
    exited = time.monotonic() - t_stop
    measured(f"{what} SIGSTOP -> named", named)
    measured(f"{what} SIGSTOP -> launcher exited", exited)
    assert named <= within_s, launcher.output
    assert wait_gone(pids, timeout=max(1.0, named + EXIT_WITHIN_S - exited)) == []
    return found


def test_stopped_trainer_rank_is_named_and_the_run_ends(tmp_path):
    launcher, run_dir, rank1, t_stop, pids = stop_trainer_1(tmp_path, "launcher.stopped_timeout_s=5")
    found = ends_naming(
        launcher,
        rank1,
        t_stop,
        pids,
        r"error: trainer-1 has been in the stopped state \(SIGSTOP\) for (\d+) s "
        r"\(launcher\.stopped_timeout_s=5\), in step \d+ \w+: .*raise launcher\.stopped_timeout_s.*; log: (\S+)",
        within_s=5 + 10,  # the timeout, plus polling on a busy machine
    )
    assert int(found.group(1)) >= 5
    assert found.group(2) == str(run_dir / "logs" / "trainer-1.log")


def test_rank_waiting_in_a_collective_times_out_naming_the_key(tmp_path):
    launcher, run_dir, rank1, t_stop, pids = stop_trainer_1(
        tmp_path, "launcher.stopped_timeout_s=null", "actor.collective_timeout_s=20"
    )
    found = ends_naming(
        launcher,
        rank1,
        t_stop,
        pids,
        r"error: trainer-0 exited with code 1: a collective between trainer ranks waited 20 s for a \w+ "
        r"\(actor\.collective_timeout_s=20\) and timed out.*still running then: trainer-1 \(stopped\).*; log: (\S+)",
        within_s=20 + 30,  # the timeout, the time rank 0 may still work alone before it waits, polling
    )
    assert found.group(1) == str(run_dir / "logs" / "trainer-0.log")


def test_rank_blocked_in_one_phase_is_named_by_the_phase_timeout(tmp_path):
    timeout = 15  # each phase of the demo takes about a second
    launcher = launch(
        tmp_path,
        "total_train_steps=200",
        "launcher.stopped_timeout_s=null",
        "launcher.server_health_timeout_s=null",
        f"launcher.trainer_phase_timeout_s={timeout}",
    )
    run_dir = run_dir_of(tmp_path)
    wait_rows(launcher, run_dir, 1)
    pids = tree_pids(launcher.proc.pid)
    server = pid_of(launcher, "server-0")
    t_stop = time.monotonic()
    os.kill(server, signal.SIGSTOP)  # the trainer keeps running, its requests unanswered
    found = ends_naming(
        launcher,
        server,
        t_stop,
        pids,
        rf"error: trainer-0 has been in (step \d+ \w+) for (\d+) s \(launcher\.trainer_phase_timeout_s={timeout}\) "
        r"without starting another phase: it is hung .*raise launcher\.trainer_phase_timeout_s.*; log: (\S+)",
        within_s=timeout + 15,  # the timeout from the phase's start (up to a step before the signal), polling
        what="server-0",
    )
    assert int(found.group(2)) >= timeout
    assert found.group(3) == str(run_dir / "logs" / "trainer-0.log")
    noticed = launcher.output.index(f"trainer-0 has been in {found.group(1)} for")  # at half the timeout
    assert noticed < launcher.output.index("error: trainer-0 has been in"), launcher.output
