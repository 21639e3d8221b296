"""The training loop against a real built-in server: metrics, weight versions, saving, recovery,
and an inference-only driver run replayed by a trainer-only run. Each run is a fresh process
(the trainer owns its torch.distributed group), as areal-launch starts it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from areal.config import validate_config
from areal.engine.fsdp.optim import lr_multiplier
from launcher.compose import compose

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def arith_model(tmp_path_factory):
    from areal.models.resolve import TINY_PRESETS
    from areal.models.tiny import make_tiny_model_dir

    return str(make_tiny_model_dir(tmp_path_factory.mktemp("m") / "arith", **TINY_PRESETS["arith"]))


@pytest.fixture(scope="module")
def server(arith_model, tmp_path_factory):
    from tests.serving import start_server

    # the trainer-only runs write disk weight updates under their tmp_path fileroots
    handle = start_server(
        arith_model, extra_args=["--dtype", "float32", "--weight-dirs", tmp_path_factory.getbasetemp()]
    )
    yield handle
    handle.stop()


def write_config(tmp_path, model, overrides, name="cfg"):
    cfg = validate_config(
        compose(
            "tiny_arith_cpu",
            [f"actor.path={model}", f"cluster.fileroot={tmp_path}", "train_dataset.kwargs.size=128", *overrides],
        )
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump()))
    return cfg, path


def run_module(module, config, timeout=300):
    r = subprocess.run(
        [sys.executable, "-m", module, "--config", str(config)], capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def metrics(cfg):
    return [json.loads(line) for line in Path(cfg.run_dir, "metrics.jsonl").read_text().splitlines()]


def test_trainer_only_run_against_external_server(tmp_path, server, arith_model):
    addr = server.url.removeprefix("http://")
    cfg, path = write_config(
        tmp_path,
        arith_model,
        [
            "launcher.rollout_n_nodes=0",
            f"rollout.server_addrs=[{addr}]",
            "total_train_steps=4",
            "evaluator.freq_steps=2",
            "recover.freq_steps=2",
            "saver.freq_steps=2",
            "actor.max_tokens_per_mb=auto",  # on CPU: the fixed 16384, reported every step
        ],
    )
    run_module("areal.trainer.main", path)
    rows = metrics(cfg)
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["train/mb_token_budget"] == r["train/mb_token_budget_forward"] == 16384 for r in steps)
    for key in ("epoch", "weight_version", "rollout/reward_mean", "train/loss", "timing/step_s"):
        assert all(key in r for r in steps), key
    assert [r["weight_version"] for r in steps] == [1, 2, 3, 4]
    # the LR schedule spans every optimizer step: training steps x PPO minibatches (train/lr is
    # that of each step's last minibatch), so it reaches its floor at the end, not after step 1
    n_mb = cfg.actor.ppo_n_minibatches
    assert n_mb > 1
    multiplier = lr_multiplier(cfg.actor.optimizer, 4 * n_mb)
    expected = [cfg.actor.optimizer.lr * multiplier(n_mb * s - 1) for s in (1, 2, 3, 4)]
    assert [r["train/lr"] for r in steps] == pytest.approx(expected, rel=1e-6)
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in steps[1]  # before training, then every 2
    for row in (rows[0], steps[1]):  # each evaluation's binomial standard error over its problems
        p, n = row["eval/accuracy"], row["eval/n"]
        assert n > 0 and row["eval/accuracy_se"] == pytest.approx((p * (1 - p) / n) ** 0.5)
    assert requests.get(server.url + "/model_info", timeout=10).json()["weight_version"] == "4"
    assert all("weight_update/seconds" in r and r["rollout/staleness_max"] >= 0 for r in steps)
    assert all(
        0 <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] and 0 <= r["rollout/mixed_version_frac"] <= 1
        for r in steps
    )
    # the staleness bound's seconds since the previous step: held episodes back, and of those none ran
    assert all(0 <= r["rollout/bound_idle_s"] <= r["rollout/bound_held_s"] + 1e-9 for r in steps)
    # and the wait for older episodes while enough had finished, within the step
    assert all(0 <= r["rollout/order_wait_s"] <= r["timing/step_s"] for r in steps)
    # around each update: pausing (the built-in server reports its own share) and resuming
    assert all(
        0 <= r["weight_update/server_pause_s"] <= r["weight_update/pause_request_s"] <= r["weight_update/pause_s"]
        and r["weight_update/resume_s"] >= 0
        for r in steps
    )
    # how many requests the servers ran or queued as each pause began (their /v1/loads)
    assert all(r["weight_update/requests_in_flight"] >= 0 for r in steps)
    # what the server did per step: every batch (and the evaluations) went through its counters
    assert all(
        r["server/decode_steps"] > 0 and r["server/mean_decode_batch"] >= 1 and 0 < r["server/forward_frac"] <= 1.05
        for r in steps
    )
    assert sum(r["server/generated_tokens"] for r in steps) >= sum(r["rollout/gen_tokens"] for r in steps)
    assert all(r["rollout/tokens"] > r["rollout/gen_tokens"] for r in steps)  # prompts counted too
    # one rank: what it trained on over the step's minibatches is the whole batch
    assert cfg.actor.backend == "fsdp:d1" and all(r["train/n_tokens"] == r["rollout/tokens"] for r in steps)
    run_dir = Path(cfg.run_dir)
    assert (run_dir / "models" / "final" / "config.json").exists()
    assert (run_dir / "models" / "step_00000002" / "tokenizer.json").exists()
    assert (run_dir / "metrics.png").read_bytes()[:4] == b"\x89PNG"

    # recovery: the same trial with a longer horizon resumes after the step-4 checkpoint
    cfg2, path2 = write_config(
        tmp_path,
        arith_model,
        [
            "launcher.rollout_n_nodes=0",
            f"rollout.server_addrs=[{addr}]",
            "total_train_steps=6",
            "recover.mode=auto",
            "recover.freq_steps=2",
            "rollout.pause_ahead_minibatches=1",  # the servers pause as the last minibatch trains
        ],
        name="resume",
    )
    run_module("areal.trainer.main", path2)
    resumed = [r["step"] for r in metrics(cfg2) if r["step"] > 0]
    assert resumed == [1, 2, 3, 4, 5, 6]  # 5 and 6 appended by the resumed run, nothing retrained
    assert metrics(cfg2)[-1]["weight_version"] == 6
    # the resumed steps' pauses began during training; each update waited for what was left of it
    assert all(r["weight_update/pause_ahead_s"] >= 0 for r in metrics(cfg2)[-2:])
    assert not any("weight_update/pause_ahead_s" in r for r in steps)

    # a fresh run in that folder appends to its metrics.jsonl, and says so as it starts
    n_rows = len(metrics(cfg2))
    _, path3 = write_config(
        tmp_path,
        arith_model,
        [
            "launcher.rollout_n_nodes=0",
            f"rollout.server_addrs=[{addr}]",
            "total_train_steps=1",
            "evaluator.freq_steps=null",
        ],
        name="resume",
    )
    fresh = run_module("areal.trainer.main", path3)
    assert f"metrics.jsonl already holds {n_rows} row(s) of an earlier run (steps 0-6)" in fresh.stderr, fresh.stderr
    assert [r["step"] for r in metrics(cfg2)][n_rows:] == [1]


def test_the_pause_ahead_starts_before_the_last_minibatches():
    from areal.trainer.grpo import pause_ahead_index

    assert pause_ahead_index(4, 0) is None  # at the weight update
    assert [pause_ahead_index(4, k) for k in (1, 2, 4)] == [3, 2, 0]
    assert pause_ahead_index(1, 1) == 0


def test_corrupt_replay_is_rejected_with_the_path(tmp_path, arith_model):
    folder = tmp_path / "rollouts"
    folder.mkdir()
    (folder / "index.json").write_text('{"format": "areal-rollouts/1", "batches": [{"file": "batch_00000.pt"}]}')
    (folder / "batch_00000.pt").write_bytes(b"not a torch file")
    cfg, path = write_config(
        tmp_path, arith_model, ["launcher.rollout_n_nodes=0", f"rollout.replay_path={folder}", "total_train_steps=1"]
    )
    r = subprocess.run(
        [sys.executable, "-m", "areal.trainer.main", "--config", str(path)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode != 0 and f"{folder}/batch_00000.pt cannot be read" in r.stderr
