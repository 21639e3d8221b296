"""Each algo/ preset (configs/algo/) in a short real training run: the tiny arithmetic model, a
built-in server, a trainer-only run of a few steps, as areal-launch would start the trainer.

The per-step metrics of the new knobs must be there and agree with each other: dynamic
sampling's dropped share and extra samples, the rollout/trainer mismatch, the overlong penalty,
and the entropy."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from areal.config import validate_config
from launcher.compose import compose

pytestmark = pytest.mark.slow

STEPS = 3


@pytest.fixture(scope="module")
def arith_model(tmp_path_factory):
    from areal.models.resolve import TINY_PRESETS
    from areal.models.tiny import make_tiny_model_dir

    return str(make_tiny_model_dir(tmp_path_factory.mktemp("m") / "arith", **TINY_PRESETS["arith"]))


@pytest.fixture(scope="module")
def server(arith_model, tmp_path_factory):
    from tests.serving import start_server

    handle = start_server(
        arith_model, extra_args=["--dtype", "float32", "--weight-dirs", tmp_path_factory.getbasetemp()]
    )
    yield handle
    handle.stop()


def train(tmp_path, server, model, overrides):
    addr = server.url.removeprefix("http://")
    cfg = validate_config(
        compose(
            "tiny_arith_cpu",
            [
                f"actor.path={model}",
                f"cluster.fileroot={tmp_path}",
                "train_dataset.kwargs.size=128",
                "launcher.rollout_n_nodes=0",
                f"rollout.server_addrs=[{addr}]",
                f"total_train_steps={STEPS}",
                "evaluator.freq_steps=null",
                "stats_logger.plot=false",
                "saver.save_at_end=false",
                *overrides,
            ],
        )
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump()))
    r = subprocess.run(
        [sys.executable, "-m", "areal.trainer.main", "--config", str(path)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in Path(cfg.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    return cfg, rows


def check_mismatch(row):
    assert row["mismatch/kl"] >= 0
    assert 0 < row["mismatch/is_weight_mean"] <= row["mismatch/is_weight_max"]
    assert 0 <= row["mismatch/is_capped_frac"] <= 1


def test_grpo_with_rollout_correction_and_entropy_bonus(tmp_path, server, arith_model):
    cfg, rows = train(
        tmp_path,
        server,
        arith_model,
        [
            "algo=grpo",
            "actor.rollout_is=tis",
            "actor.rollout_is_level=sequence",
            "actor.behav_imp_weight_cap=null",
            "actor.entropy_coeff=0.01",
        ],
    )
    assert (cfg.actor.eps_clip_low, cfg.actor.eps_clip_high) == (0.2, 0.2)
    for row in rows:
        check_mismatch(row)
        assert row["train/loss_fn/entropy"] > 0
        assert "rollout/dropped_groups_frac" not in row and "rollout/overlong_frac" not in row
        assert row["rollout/n_samples"] == 32 * 8


def test_dapo(tmp_path, server, arith_model):
    cfg, rows = train(tmp_path, server, arith_model, ["algo=dapo"])
    assert cfg.rollout.dynamic_sampling and cfg.actor.eps_clip_high == 0.28
    n = cfg.gconfig.n_samples
    for row in rows:
        assert row["rollout/n_samples"] == 32 * n  # the batch is full despite the dropped groups
        frac, extra = row["rollout/dropped_groups_frac"], row["rollout/extra_samples"]
        assert 0 <= frac < 1 and extra % n == 0
        dropped = extra / n  # frac = dropped / (dropped + 32 kept groups)
        assert frac == pytest.approx(dropped / (dropped + 32))
        assert row["rollout/kept_past_limit"] == 0
        # the budget is 3 tokens, the buffer 0.6: 3-token answers get -1, shorter ones nothing
        assert 0 <= row["rollout/overlong_frac"] <= 1
        assert row["rollout/overlong_penalty_mean"] == pytest.approx(-row["rollout/overlong_frac"])
        assert 0 <= row["train/loss_fn/clip_high_frac"] <= row["train/loss_fn/clip_frac"] <= 1
        check_mismatch(row)


def test_dr_grpo(tmp_path, server, arith_model):
    """Also with the first PPO minibatch's proximal logprobs from its training forward: the
    recompute pass covers 3 of the 4 minibatches, and the mismatch is measured over those."""
    cfg, rows = train(tmp_path, server, arith_model, ["algo=dr_grpo", "actor.recompute_first_minibatch=false"])
    assert cfg.actor.token_aggregation == "seq_mean_token_sum" and not cfg.actor.adv_norm_std
    assert cfg.actor.ppo_n_minibatches == 4 and cfg.actor.use_decoupled_loss
    for row in rows:
        assert row["train/loss"] is not None and row["train/grad_norm"] >= 0
        assert 0 < row["train/loss_fn/importance_ratio"] < 2
        check_mismatch(row)


def test_loglinear_proximal_logprobs_skip_the_recompute_pass(tmp_path, server, arith_model):
    """actor.prox_logp_method=loglinear: no recompute pass (so no mismatch figures), and the mean
    interpolation weight follows the tokens' staleness: on tokens of the trainer's own version only
    the first of the 4 minibatches leans on its own forward (weight 1, the rest 0)."""
    cfg, rows = train(tmp_path, server, arith_model, ["actor.prox_logp_method=loglinear"])
    assert cfg.actor.ppo_n_minibatches == 4
    # step 1's samples are no older than the trainer's version 0 (the module's server may be ahead:
    # the other tests' trainers pushed their versions to it, and a token never counts as newer)
    assert rows[0]["rollout/staleness_max"] <= 0
    for row in rows:
        assert "mismatch/kl" not in row
        alpha = row["train/loss_fn/prox_alpha"]
        assert 0 < alpha <= 1
        if row["rollout/staleness_max"] <= 0:
            assert alpha < 0.5
        assert 0 < row["train/loss_fn/importance_ratio"] < 2
