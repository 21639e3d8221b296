"""Ray backend pieces that need no cluster: config errors stop before Ray, bundle layout."""

from __future__ import annotations

import subprocess
import sys

from launcher.plan import LaunchPlan, ProcessSpec
from launcher.ray import node_bundles, process_resources
from tests.launcher.helpers import REPO, repo_env

CHECK = """
import sys
from launcher.cli import main
rc = main(["--config", "gsm8k_grpo", "cluster=cpu", "launcher.backend=ray", "launcher.ray_address=auto",
           "actor.optimizer.lr=-1", "launcher.trainer_n_nodes=-1"])
assert "ray" not in sys.modules, "ray was imported before the config was valid"
sys.exit(rc)
"""


def test_bad_config_exits_2_before_ray_is_touched(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=REPO,
        env=repo_env(RAY_TMPDIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "actor.optimizer.lr" in done.stderr and "launcher.trainer_n_nodes" in done.stderr
    assert not list(tmp_path.iterdir())  # no Ray session directory was created


def _spec(role, index, node, devices):
    return ProcessSpec(role, index, node, devices, ["x"], {})


def test_one_bundle_per_plan_node_with_its_processes_resources():
    plan = LaunchPlan(
        "/tmp/r",
        "cuda",
        "sglang",
        [
            _spec("server", 0, 0, [0, 1]),
            _spec("server", 1, 0, [2, 3]),
            _spec("trainer", 0, 1, [0]),
            _spec("trainer", 1, 1, [1]),
            _spec("trainer", 2, 2, [0]),
        ],
    )
    bundles, index = node_bundles(plan)
    assert bundles == [{"CPU": 2.0, "GPU": 4.0}, {"CPU": 2.0, "GPU": 2.0}, {"CPU": 1.0, "GPU": 1.0}]
    assert index == {0: 0, 1: 1, 2: 2}
    assert process_resources(_spec("driver", 0, 0, []), plan) == {"CPU": 1.0}
    assert process_resources(_spec("trainer", 0, 0, [3]), LaunchPlan("/tmp/r", "cpu", "builtin")) == {"CPU": 1.0}


def test_colocated_processes_share_their_gpus_in_one_bundle():
    """One GPU for a server and a trainer: one bundle of one GPU, half of it each."""
    server, trainer = _spec("server", 0, 0, [0]), _spec("trainer", 0, 0, [0])
    plan = LaunchPlan("/tmp/r", "cuda", "builtin", [server, trainer], colocated=True)
    bundles, _ = node_bundles(plan)
    assert bundles == [{"CPU": 2.0, "GPU": 1.0}]
    assert process_resources(server, plan) == process_resources(trainer, plan) == {"CPU": 1.0, "GPU": 0.5}
    # two GPUs, one server on both (tp 2) and a trainer rank on each: the bundle still holds 2 GPUs
    plan = LaunchPlan(
        "/tmp/r",
        "cuda",
        "sglang",
        [_spec("server", 0, 0, [0, 1]), _spec("trainer", 0, 0, [0]), _spec("trainer", 1, 0, [1])],
        colocated=True,
    )
    assert node_bundles(plan)[0] == [{"CPU": 3.0, "GPU": 2.0}]
