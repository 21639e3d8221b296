"""Trainer rank 0 checks its open-file limit before anything starts: agents in its own process need
three descriptors per call in flight, and a hard limit below that is an error naming the limit, the
need and the keys (not `accept() out of system resource` in the middle of a step)."""

import resource
import subprocess
import sys

import yaml

from areal.config import validate_config
from areal.infra.sockets import rollout_client_open_files
from launcher.compose import compose


def agent_config(*overrides):
    return validate_config(compose("calculator_agent_cpu", ["gconfig.n_samples=8", *overrides]))


def test_the_need_follows_the_concurrency_and_where_the_agents_run():
    cfg = agent_config("rollout.max_concurrent_rollouts=100")
    assert rollout_client_open_files(cfg) == (800 + 256, "rollout.max_concurrent_rollouts x gconfig.n_samples")
    need, keys = rollout_client_open_files(
        agent_config("rollout.max_concurrent_rollouts=100", "workflow.agent.workers=0")
    )
    assert need == 3 * 800 + 256 and "workflow.agent.workers=0" in keys


def test_a_hard_limit_below_the_need_stops_rank_0_before_it_starts(tmp_path):
    cfg = agent_config("rollout.max_concurrent_rollouts=100", "workflow.agent.workers=0")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    r = subprocess.run(
        [sys.executable, "-m", "areal.trainer.main", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=low_limit,
    )
    assert r.returncode != 0
    assert "needs about 2656 open files" in r.stderr and "ulimit -Hn" in r.stderr and "is 1024" in r.stderr
    assert "rollout.max_concurrent_rollouts x gconfig.n_samples" in r.stderr
