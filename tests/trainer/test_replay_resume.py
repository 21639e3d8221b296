"""A trainer-only replay run (rollout.replay_path) that dies and is recovered with
recover.mode=auto trains on exactly the batches an uninterrupted run trains on, step by step:
the checkpoint keeps the replay position (ReplayRollouts.loader_state) and the recovered run
continues there instead of at the first saved batch.

The interrupted run dies at a fixed point without a timing race: one saved batch (the one
step 5 needs) is damaged, so the trainer fails at step 5 after its step-3 checkpoint and a
logged step 4; the batch is then restored and the run recovered. Real trainer processes
(`python -m areal.trainer.main`, as the launcher starts them) on the tiny arithmetic model.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from areal.config import validate_config
from areal.trainer.prompt_log import compare_prompts, read_prompts
from launcher.compose import compose

pytestmark = pytest.mark.slow
N_BATCHES, STEPS, GROUP = 7, 6, 8


@pytest.fixture(scope="module")
def arith_model(tmp_path_factory):
    from areal.models.resolve import TINY_PRESETS
    from areal.models.tiny import make_tiny_model_dir

    return str(make_tiny_model_dir(tmp_path_factory.mktemp("m") / "arith", **TINY_PRESETS["arith"]))


def saved_rollouts(folder: Path) -> list[float]:
    """N_BATCHES saved batches of two GRPO groups each, told apart by their reward means and
    record ids (batch k holds records 2k and 2k+1); returns the reward means."""
    import torch

    from areal.trainer.rollouts import RolloutWriter

    writer = RolloutWriter(folder, n_samples=GROUP)
    gen = torch.Generator().manual_seed(0)
    means = []
    for k in range(N_BATCHES):
        rows, prompt, answer = 2 * GROUP, 4, 3
        ids = torch.randint(3, 14, (rows, prompt + answer), generator=gen)
        generated = torch.zeros(rows, prompt + answer, dtype=torch.bool)
        generated[:, prompt:] = True
        rewards = (torch.arange(rows) % 4).float() / 4 + k  # varies within groups: nonzero advantages
        writer.write(
            {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "loss_mask": generated.long(),
                "logprobs": torch.where(generated, torch.full(ids.shape, -2.0), torch.zeros(ids.shape)),
                "versions": torch.where(generated, 0, -1),
                "rewards": rewards,
                "record_id": torch.tensor([2 * k] * GROUP + [2 * k + 1] * GROUP),
            }
        )
        means.append(float(rewards.mean()))
    return means


def config(tmp_path, model, replay: Path, name: str, *extra: str) -> tuple[Path, Path]:
    cfg = validate_config(
        compose(
            "tiny_arith_cpu",
            [
                f"actor.path={model}",
                f"cluster.fileroot={tmp_path}",
                f"experiment_name={name}",
                "launcher.rollout_n_nodes=0",
                f"rollout.replay_path={replay}",
                f"total_train_steps={STEPS}",
                "recover.freq_steps=3",
                "evaluator.freq_steps=null",
                "saver.save_at_end=false",
                "stats_logger.plot=false",
                "stats_logger.progress_bar=false",
                *extra,
            ],
        )
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump()))
    return path, Path(cfg.run_dir)


def train(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "areal.trainer.main", "--config", str(path)], capture_output=True, text=True, timeout=300
    )


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_recovered_replay_trains_on_the_same_batches(tmp_path, arith_model):
    replay = tmp_path / "rollouts"
    means = saved_rollouts(replay)
    expected = [means[(s - 1) % N_BATCHES] for s in range(1, STEPS + 1)]

    path, straight = config(tmp_path, arith_model, replay, "straight")
    r = train(path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [m["rollout/reward_mean"] for m in metrics(straight)] == pytest.approx(expected)

    # the interrupted run: the batch of step 5 is damaged, so it dies there (checkpoint: step 3)
    victim = replay / "batch_00004.pt"
    shutil.copy(victim, tmp_path / "good.pt")
    victim.write_bytes(b"damaged")
    path, broken = config(tmp_path, arith_model, replay, "broken", "recover.mode=auto")
    r = train(path)
    assert r.returncode != 0 and "batch_00004.pt are damaged" in r.stderr, r.stderr[-3000:]
    assert [m["step"] for m in metrics(broken)] == [1, 2, 3, 4]  # step 4 is past the checkpoint

    shutil.copy(tmp_path / "good.pt", victim)
    r = train(path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming at step 4" in r.stderr, r.stderr[-3000:]
    rows = metrics(broken)
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))
    assert [m["rollout/reward_mean"] for m in rows] == pytest.approx(expected)  # not batches 0-2 again
    assert (
        read_prompts(broken)
        == read_prompts(straight)
        == {s: [2 * ((s - 1) % N_BATCHES), 2 * ((s - 1) % N_BATCHES) + 1] for s in range(1, STEPS + 1)}
    )
    assert compare_prompts(straight, broken) == []
