"""Hydra composition: groups, the override grammar, interpolation, configs outside configs/."""

import pytest

from areal.config import ConfigError, validate_config
from launcher.compose import compose


def test_defaults_list_selects_groups():
    raw = compose("gsm8k_grpo")
    assert raw["actor"]["path"] == "Qwen/Qwen2.5-1.5B-Instruct"  # from actor/qwen2.5-1.5b-instruct.yaml
    assert raw["rollout"]["max_head_offpolicyness"] == 2  # rollout/async.yaml
    assert raw["cluster"]["n_gpus_per_node"] == 8
    assert raw["actor"]["backend"] == "fsdp:d4"  # _self_ after the groups wins
    assert compose("gsm8k_grpo.yaml") == raw  # name with or without .yaml


def test_group_selection_override():
    assert compose("gsm8k_grpo", ["rollout=sync"])["rollout"]["max_head_offpolicyness"] == 0


@pytest.mark.parametrize(
    "override, check",
    [
        ("actor.optimizer.lr=1e-6", lambda r: r["actor"]["optimizer"]["lr"] == 1e-6),
        ("actor.c_clip=null", lambda r: r["actor"]["c_clip"] is None),
        ("gconfig.stop=[a,'b c']", lambda r: r["gconfig"]["stop"] == ["a", "b c"]),
        ("+launcher.trainer_env.NCCL_DEBUG=INFO", lambda r: r["launcher"]["trainer_env"] == {"NCCL_DEBUG": "INFO"}),
        ("~actor.c_clip", lambda r: "c_clip" not in r["actor"]),
        (
            "rollout.server_addrs=[127.0.0.1:1,127.0.0.1:2]",
            lambda r: r["rollout"]["server_addrs"] == ["127.0.0.1:1", "127.0.0.1:2"],
        ),
        ("sglang.context_length=4096", lambda r: r["sglang"]["context_length"] == 4096),
    ],
)
def test_override_grammar(override, check):
    assert check(compose("gsm8k_grpo", [override]))


def test_env_values_become_text():
    cfg = validate_config(compose("gsm8k_grpo", ["+launcher.trainer_env.NCCL_DEBUG_SUBSYS=1", "cluster.device=cpu"]))
    assert cfg.launcher.trainer_env == {"NCCL_DEBUG_SUBSYS": "1"}


def test_deleted_key_falls_back_to_the_schema_default():
    cfg = validate_config(compose("gsm8k_grpo", ["~actor.c_clip", "cluster.device=cpu"]))
    assert cfg.actor.c_clip is None


def test_every_schema_key_is_overridable_without_plus():
    from launcher.compose import schema_keys

    raw = compose(
        "gsm8k_grpo",
        ["launcher.ray_address=auto", "ref.path=/ref", "recover.keep_last=3", "cluster.name_resolve.record_root=/nfs"],
    )
    assert raw["launcher"]["ray_address"] == "auto" and raw["ref"]["path"] == "/ref"
    assert raw["recover"]["keep_last"] == 3 and raw["cluster"]["name_resolve"]["record_root"] == "/nfs"
    assert len(schema_keys()) > 100


def test_unknown_override_names_closest_key():
    with pytest.raises(ConfigError) as e:
        compose("gsm8k_grpo", ["actor.optimzer.lr=1"])
    issue = e.value.issues[0]
    assert issue.key == "actor.optimzer.lr" and "actor.optimizer.lr" in issue.fix


def test_unknown_group_option_lists_choices():
    with pytest.raises(ConfigError) as e:
        compose("gsm8k_grpo", ["rollout=asynch"])
    assert "async" in e.value.issues[0].fix and "sync" in e.value.issues[0].fix


def test_unknown_config_name():
    with pytest.raises(ConfigError, match="gsm8k_grpo"):
        compose("no_such_experiment")


def test_config_outside_configs_uses_project_groups_and_interpolation(tmp_path):
    exp = tmp_path / "my" / "exp.yaml"
    exp.parent.mkdir()
    exp.write_text(
        "defaults:\n  - actor: qwen2.5-1.5b-instruct\n  - rollout: sync\n  - _self_\n"
        "experiment_name: mine\n"
        "ref:\n  dtype: ${actor.dtype}\n"
        "train_dataset:\n  path: /data\n"
    )
    raw = compose(str(exp), ["actor.dtype=float16"])
    assert raw["experiment_name"] == "mine"
    assert raw["actor"]["path"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert raw["rollout"]["max_head_offpolicyness"] == 0
    assert raw["ref"]["dtype"] == "float16"  # the interpolation follows the override
    unresolved = compose(str(exp), resolve=False)
    assert unresolved["ref"]["dtype"] == "${actor.dtype}"


def test_misspelt_key_in_yaml_is_caught_by_validation(tmp_path):
    exp = tmp_path / "typo.yaml"
    exp.write_text("actor:\n  path: m\n  eps_clp: 0.3\ntrain_dataset:\n  path: d\n")
    with pytest.raises(ConfigError) as e:
        validate_config(compose(str(exp)))
    issue = e.value.issues[0]
    assert issue.key == "actor.eps_clp" and "actor.eps_clip" in issue.fix
