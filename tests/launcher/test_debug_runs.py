"""Debug layouts through areal-launch itself: an inference-only run (servers + rollout driver)
saves rollouts, then a trainer-only run (no servers) replays them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def launch(tmp_path, *overrides):
    env = {**os.environ, "AREAL_CACHE": str(tmp_path / "cache")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "--config",
            "tiny_arith_cpu.yaml",
            f"cluster.fileroot={tmp_path}",
            "train_dataset.batch_size=8",
            "evaluator.freq_steps=null",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.mark.slow
def test_inference_only_run_then_trainer_only_replay(tmp_path):
    r = launch(
        tmp_path,
        "experiment_name=inference",
        "launcher.trainer_n_nodes=0",
        "launcher.inference_only_batches=2",
        "launcher.server_base_port=31800",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run_dir = tmp_path / "inference" / "demo"
    index = json.loads((run_dir / "rollouts" / "index.json").read_text())
    assert [b["n_sequences"] for b in index["batches"]] == [64, 64]
    driver_log = (run_dir / "logs" / "driver-0.log").read_text()
    assert '"reward_mean"' in driver_log and '"samples_per_s"' in driver_log
    assert (run_dir / "logs" / "server-0.log").exists()

    r = launch(
        tmp_path,
        "experiment_name=replay",
        "launcher.rollout_n_nodes=0",
        f"rollout.replay_path={run_dir / 'rollouts'}",
        "total_train_steps=3",  # one more than the saved batches: the replay starts over
        "launcher.trainer_master_port=29800",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    replay_dir = tmp_path / "replay" / "demo"
    assert "weight updates are skipped" in (replay_dir / "logs" / "trainer-0.log").read_text()
    plan = json.loads((replay_dir / "plan.json").read_text())
    assert [p["role"] for p in plan["processes"]] == ["trainer"]
    rows = [json.loads(line) for line in (replay_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    saved = [b["reward_mean"] for b in index["batches"]]
    assert [row["rollout/reward_mean"] for row in rows] == pytest.approx([saved[0], saved[1], saved[0]], abs=1e-6)
    assert Path(replay_dir / "models" / "final" / "config.json").exists()
