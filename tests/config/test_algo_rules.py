"""The algorithm knobs' cross-field rules, the follow-defaults of the clip range and W&B, and the
algo/ presets composing and dry-running through the CLI."""

import pytest

import launcher.cli as cli
from areal.config import ConfigError, validate_config
from launcher.compose import compose


def base(**actor) -> dict:
    return {
        "actor": {"path": "m", **actor},
        "train_dataset": {"path": "d", "batch_size": 8},
        "cluster": {"n_gpus_per_node": 8},
    }


def issues(raw) -> list:
    with pytest.raises(ConfigError) as e:
        validate_config(raw)
    return e.value.issues


def test_clip_bounds_follow_eps_clip_and_the_resolved_config_revalidates():
    cfg = validate_config(base(eps_clip=0.3))
    assert (cfg.actor.eps_clip_low, cfg.actor.eps_clip_high) == (0.3, 0.3)
    cfg = validate_config(base(eps_clip=0.3, eps_clip_high=0.4))
    assert (cfg.actor.eps_clip_low, cfg.actor.eps_clip_high) == (0.3, 0.4)
    assert validate_config(cfg.model_dump()) == cfg  # the written config.yaml loads back unchanged


def test_a_changed_eps_clip_beside_both_bounds_is_reported():
    [issue] = issues(base(eps_clip=0.1, eps_clip_low=0.2, eps_clip_high=0.28))
    assert issue.key == "actor.eps_clip" and "has no effect" in issue.rule and "eps_clip_low" in issue.fix
    validate_config(base(eps_clip_low=0.2, eps_clip_high=0.28))  # eps_clip left at its default


def test_lower_clip_epsilon_below_one():
    [issue] = issues(base(eps_clip=1.5, eps_clip_high=0.3))
    assert issue.key == "actor.eps_clip_low" and issue.value == 1.5 and "follows actor.eps_clip" in issue.rule


def test_rollout_correction_rules():
    [issue] = issues(base(rollout_is="tis", recompute_logprob=False, use_decoupled_loss=False))
    assert issue.key == "actor.rollout_is" and "actor.recompute_logprob=true" in issue.fix
    [issue] = issues(base(rollout_is="mis", behav_imp_weight_cap=5.0))
    assert issue.key == "actor.behav_imp_weight_cap" and "actor.rollout_is_cap" in issue.fix
    validate_config(base(rollout_is="mis", behav_imp_weight_cap=5.0, use_decoupled_loss=False))
    [issue] = issues(base(rollout_is_cap=0.5))
    assert issue.key == "actor.rollout_is_cap"


def test_prox_logp_method_rules():
    validate_config(base(prox_logp_method="loglinear"))
    validate_config(base(prox_logp_method="metrics", rollout_is="tis"))
    [issue] = issues(base(prox_logp_method="loglinear", recompute_logprob=False, use_decoupled_loss=False))
    assert issue.key == "actor.prox_logp_method" and issue.value == "loglinear"
    assert "actor.recompute_logprob=true" in issue.fix
    [issue] = issues(base(prox_logp_method="loglinear", rollout_is="tis"))
    assert issue.key == "actor.prox_logp_method" and "actor.rollout_is=none" in issue.fix
    [issue] = issues(base(prox_logp_method="interpolate"))
    assert issue.key == "actor.prox_logp_method"


def test_dynamic_sampling_rules():
    raw = base()
    raw["rollout"] = {"dynamic_sampling": True}
    raw["gconfig"] = {"n_samples": 1}
    raw["actor"]["adv_norm"] = "batch"
    [issue] = issues(raw)
    assert issue.key == "rollout.dynamic_sampling" and "gconfig.n_samples>=2" in issue.fix
    raw = base()
    raw["rollout"] = {"dynamic_sampling": True, "replay_path": "/r"}
    raw["launcher"] = {"rollout_n_nodes": 0}
    [issue] = issues(raw)
    assert issue.key == "rollout.dynamic_sampling" and "replay" in issue.rule
    raw = base()
    raw["rollout"] = {"dynamic_sampling": True, "max_overgeneration": -1}
    [issue] = issues(raw)
    assert issue.key == "rollout.max_overgeneration"


def test_wandb_names_follow_the_experiment():
    raw = base()
    raw.update(experiment_name="exp", trial_name="t3")
    wb = validate_config(raw).stats_logger.wandb
    assert (wb.mode, wb.project, wb.name) == ("disabled", "exp", "t3")
    raw["stats_logger"] = {"wandb": {"mode": "offline", "project": "mine", "tags": ["a"]}}
    wb = validate_config(raw).stats_logger.wandb
    assert (wb.mode, wb.project, wb.name, wb.tags) == ("offline", "mine", "t3", ["a"])
    raw["stats_logger"] = {"wandb": {"mode": "on"}}
    assert [i.key for i in issues(raw)] == ["stats_logger.wandb.mode"]


@pytest.mark.parametrize(
    "algo, expect",
    [
        (
            "grpo",
            dict(
                eps_clip_low=0.2,
                eps_clip_high=0.2,
                token_aggregation="token_mean",
                adv_norm_std=True,
                overlong_buffer_frac=0.0,
                dynamic_sampling=False,
            ),
        ),
        (
            "dapo",
            dict(
                eps_clip_low=0.2,
                eps_clip_high=0.28,
                token_aggregation="token_mean",
                adv_norm_std=True,
                overlong_buffer_frac=0.2,
                dynamic_sampling=True,
            ),
        ),
        (
            "dr_grpo",
            dict(
                eps_clip_low=0.2,
                eps_clip_high=0.2,
                token_aggregation="seq_mean_token_sum",
                adv_norm_std=False,
                overlong_buffer_frac=0.0,
                dynamic_sampling=False,
            ),
        ),
    ],
)
def test_presets_compose_and_dry_run(algo, expect, tmp_path, capsys):
    for config in ("tiny_arith_cpu", "gsm8k_grpo"):
        cfg = validate_config(compose(config, [f"algo={algo}"]))
        got = {k: getattr(cfg.actor, k) for k in expect if k != "dynamic_sampling"}
        got["dynamic_sampling"] = cfg.rollout.dynamic_sampling
        # the demo sets its own advantages (no std) after the preset, whichever preset it is
        want = {**expect, "adv_norm_std": False} if config == "tiny_arith_cpu" else expect
        assert got == want, config
    assert (
        cli.main(["--config", "tiny_arith_cpu.yaml", f"algo={algo}", f"cluster.fileroot={tmp_path}", "--dry-run"]) == 0
    )
    assert "trainer-0" in capsys.readouterr().out


def test_grpo_preset_is_the_schema_default():
    assert compose("tiny_arith_cpu", ["algo=grpo"]) == compose("tiny_arith_cpu", [])


def test_a_changed_eps_clip_under_dapo_fails_before_anything_starts(tmp_path, capsys):
    rc = cli.main(
        [
            "--config",
            "tiny_arith_cpu.yaml",
            "algo=dapo",
            "actor.eps_clip=0.1",
            f"cluster.fileroot={tmp_path}",
            "--dry-run",
        ]
    )
    assert rc == 2 and "actor.eps_clip = 0.1: has no effect" in capsys.readouterr().err
    assert not (tmp_path / "tiny_arith_cpu").exists()
