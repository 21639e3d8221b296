"""A Ray the launcher starts for the run itself (launcher.backend=ray, launcher.ray_address null).

The CPU demo with two trainer ranks reserves 3 CPUs (a server and two ranks); the local backend
runs it on a 2-core machine, and so must a local Ray: its logical CPUs are sized to the plan, and
it is always a new instance, which stops with the run.
"""

from __future__ import annotations

import os
import time

import pytest
from chaos import ray_leftovers

from launcher.ray import local_ray_options, node_bundles
from tests.launcher.helpers import make_cfg, make_plan
from tests.launcher.test_faults import launch, rows, run_dir_of

pytest.importorskip("ray")


def test_local_ray_holds_what_the_plan_reserves(tmp_path):
    plan = make_plan(make_cfg(tmp_path, "launcher.backend=ray"))
    bundles, _ = node_bundles(plan)
    assert bundles == [{"CPU": 3.0}]  # server-0, trainer-0, trainer-1
    options = local_ray_options(plan)
    assert options["address"] == "local"  # never a `ray start` cluster left on the machine
    assert options["num_cpus"] == max(os.cpu_count() or 1, 3)
    assert options["include_dashboard"] is False


@pytest.mark.slow
def test_demo_with_two_ranks_runs_on_a_local_ray(tmp_path):
    since = time.time() - 1
    launcher = launch(
        tmp_path,
        "actor.backend=fsdp:d2",
        "cluster.n_gpus_per_node=3",
        "total_train_steps=2",
        "launcher.backend=ray",
    )
    rc = launcher.wait(300)  # a hang guard only
    assert rc == 0, launcher.output
    assert "starting a local Ray instance" in launcher.output
    assert [r["step"] for r in rows(run_dir_of(tmp_path)) if r.get("step", 0) > 0] == [1, 2]
    deadline = time.monotonic() + 60
    while (left := ray_leftovers(since)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"the run's Ray outlived it: {left}"
