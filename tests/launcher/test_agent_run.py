"""The calculator agent (examples/calculator_agent.py) through areal-launch on CPU: the agent
workflow's proxy, the built-in server and the FSDP trainer in one run, as CI smoke-tests it."""

import json
import os
import re
import subprocess
import sys

import psutil
import pytest

from tests.launcher.helpers import REPO, free_ports

pytestmark = pytest.mark.slow


def test_calculator_agent_cpu_run(tmp_path):
    env = {**os.environ, "AREAL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "--config",
            "calculator_agent_cpu.yaml",
            f"cluster.fileroot={tmp_path}",
            f"launcher.server_base_port={free_ports(1)}",
            f"launcher.trainer_master_port={free_ports(1)}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "calculator_agent_cpu" / "demo"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row["step"] > 0]
    assert [row["step"] for row in steps] == [1, 2] and [row["weight_version"] for row in steps] == [1, 2]
    for row in steps:
        assert row["rollout/agent/calls"] >= 1 and row["rollout/n_samples"] == 8
        assert 0 <= row["rollout/agent/tool_call_rate"] <= 1 and 0 <= row["rollout/agent/accuracy"] <= 1
        assert row["rollout/gen_tokens"] > 0
    assert rows[0]["step"] == 0 and rows[-1]["eval/n"] == 4  # evaluated before and after training
    log = (run_dir / "logs" / "trainer-0.log").read_text()
    assert "HTTP Request: POST" not in log
    # the agents ran in worker processes (training and evaluation: one each), gone with the run
    pids = [
        int(p)
        for found in re.findall(r"agent-worker process\(es\) run the episodes: pids \[([\d, ]+)\]", log)
        for p in found.split(",")
    ]
    assert len(pids) == 2 and not [p for p in pids if psutil.pid_exists(p)]
