"""Every validation rule, each with a config that breaks it and one that satisfies it."""

import copy

import pytest

from areal.config import ConfigError, ExperimentConfig, validate_config


def base() -> dict:
    return {"actor": {"path": "m"}, "train_dataset": {"path": "d", "batch_size": 8}, "cluster": {"n_gpus_per_node": 8}}


def with_(**dotted) -> dict:
    raw = base()
    for key, value in dotted.items():
        node = raw
        *parents, leaf = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return raw


def issues(raw) -> list:
    with pytest.raises(ConfigError) as e:
        validate_config(raw)
    return e.value.issues


def keys_of(raw) -> set[str]:
    return {i.key for i in issues(raw)}


# (bad config, key the error names, words of the rule) -- and a fixed version that validates
RULES = [
    ("c_clip", with_(actor__c_clip=1.0), "actor.c_clip", "> 1.0", with_(actor__c_clip=3.0)),
    (
        "decoupled",
        with_(actor__use_decoupled_loss=True, actor__recompute_logprob=False),
        "actor.use_decoupled_loss",
        "recomputed",
        with_(actor__use_decoupled_loss=False, actor__recompute_logprob=False),
    ),
    ("dtype", with_(actor__dtype="bf16"), "actor.dtype", "bfloat16", with_(actor__dtype="float32")),
    (
        "batch divisible",
        with_(actor__backend="fsdp:d3", train_dataset__batch_size=2, gconfig__n_samples=4),
        "train_dataset.batch_size",
        "data-parallel",
        with_(actor__backend="fsdp:d2", train_dataset__batch_size=2),
    ),
    (
        "minibatches",
        with_(actor__ppo_n_minibatches=3),
        "actor.ppo_n_minibatches",
        "minibatches",
        with_(actor__ppo_n_minibatches=4),
    ),
    (
        "pause ahead",
        with_(actor__ppo_n_minibatches=2, rollout__pause_ahead_minibatches=3),
        "rollout.pause_ahead_minibatches",
        "cannot pause 3 minibatches",
        with_(actor__ppo_n_minibatches=2, rollout__pause_ahead_minibatches=2),
    ),
    (
        "shared prompts",
        with_(actor__share_prompts=True, actor__logprobs_on_every_token=True),
        "actor.share_prompts",
        "every token",
        with_(actor__share_prompts="auto", actor__logprobs_on_every_token=True),
    ),
    (
        "n_samples group",
        with_(gconfig__n_samples=1),
        "gconfig.n_samples",
        "at least 2",
        with_(gconfig__n_samples=1, actor__adv_norm="batch"),
    ),
    (
        "devices single node",
        with_(actor__backend="fsdp:d8", rollout__backend="sglang:d2"),
        "actor.backend",
        "devices on one node",
        with_(actor__backend="fsdp:d4", rollout__backend="sglang:d4"),
    ),
    (
        "devices multi node",
        with_(cluster__n_nodes=2, actor__backend="fsdp:d16"),
        "actor.backend",
        "needs 16 devices",
        with_(cluster__n_nodes=2, actor__backend="fsdp:d8"),
    ),
    (
        "sglang tp",
        with_(sglang__tp_size=2, rollout__backend="sglang:d1t1"),
        "sglang.tp_size",
        "t1",
        with_(sglang__tp_size=2, rollout__backend="sglang:d1t2"),
    ),
    (
        "context",
        with_(sglang__context_length=100, gconfig__max_new_tokens=64, train_dataset__max_prompt_len=64),
        "sglang.context_length",
        "128",
        with_(sglang__context_length=128, gconfig__max_new_tokens=64, train_dataset__max_prompt_len=64),
    ),
    (
        "timeout",
        with_(rollout__request_timeout_s=0),
        "rollout.request_timeout_s",
        "greater than 0",
        with_(rollout__request_timeout_s=5),
    ),
    (
        "actor path",
        with_(actor__path=None),
        "actor.path",
        "required",
        with_(actor__path=None, launcher__trainer_n_nodes=0, sglang__model_path="m"),
    ),
    (
        "server model path",
        with_(actor__path=None, launcher__trainer_n_nodes=0),
        "sglang.model_path",
        "required",
        with_(actor__path=None, launcher__trainer_n_nodes=0, sglang__model_path="m"),
    ),
    (
        "both zero",
        with_(launcher__trainer_n_nodes=0, launcher__rollout_n_nodes=0),
        "launcher.trainer_n_nodes",
        "both 0",
        with_(launcher__trainer_n_nodes=0),
    ),
    (
        "too many nodes",
        with_(launcher__trainer_n_nodes=2),
        "launcher.trainer_n_nodes",
        "cluster.n_nodes",
        with_(launcher__trainer_n_nodes=1),
    ),
    (
        "malformed backend",
        with_(actor__backend="fsdp:dx"),
        "actor.backend",
        "cannot parse",
        with_(actor__backend="fsdp:d2"),
    ),
    (
        "trainer-only source",
        with_(launcher__rollout_n_nodes=0),
        "rollout.server_addrs",
        "trainer-only",
        with_(launcher__rollout_n_nodes=0, rollout__server_addrs=["127.0.0.1:30000"]),
    ),
    (
        "replay needs trainer-only",
        with_(rollout__replay_path="/r"),
        "rollout.replay_path",
        "trainer-only",
        with_(rollout__replay_path="/r", launcher__rollout_n_nodes=0),
    ),
    ("dataset type", with_(train_dataset__type="gsm9k"), "train_dataset.type", "built-in", with_()),
    (
        "files need a path",
        with_(train_dataset__type="files", train_dataset__path=None),
        "train_dataset.path",
        "required",
        with_(train_dataset__type="files"),
    ),
    (
        "generated dataset kwargs",
        with_(
            train_dataset__type="synthetic_arith",
            train_dataset__path=None,
            train_dataset__kwargs={"size": 8, "balance": True},
        ),
        "train_dataset.kwargs.balance",
        "not an argument of the synthetic_arith loader",
        with_(
            train_dataset__type="synthetic_arith",
            train_dataset__path=None,
            train_dataset__kwargs={"size": 8, "balanced": True},
        ),
    ),
    (
        "eval dataset",
        with_(evaluator__freq_steps=5, valid_dataset__type="files"),
        "valid_dataset.path",
        "required",
        with_(evaluator__freq_steps=5, valid_dataset__type="files", valid_dataset__path="d"),
    ),
    (
        "agent needs run",
        with_(workflow__type="agent"),
        "workflow.agent.run",
        "required",
        with_(workflow__type="agent", workflow__agent__run="my.agents:run"),
    ),
    (
        "agent run path",
        with_(workflow__type="agent", workflow__agent__run="run"),
        "workflow.agent.run",
        "import path",
        with_(workflow__type="agent", workflow__agent__run="my.agents:run"),
    ),
    (
        "agent workers key",
        with_(workflow__type="agent", workflow__agent__run="my.agents:run", workflow__workers=2),
        "workflow.workers",
        "workflow.agent.workers",
        with_(workflow__type="agent", workflow__agent__run="my.agents:run", workflow__agent__workers=2),
    ),
]


@pytest.mark.parametrize("name, bad, key, words, good", RULES, ids=[r[0] for r in RULES])
def test_rule(name, bad, key, words, good):
    found = issues(bad)
    match = [i for i in found if i.key == key]
    assert match, f"expected an issue on {key}, got {[i.key for i in found]}"
    assert words in match[0].rule
    assert match[0].fix  # every issue says what to do
    validate_config(good)


def test_all_problems_reported_at_once_including_cross_field_rules():
    raw = with_(
        actor__c_clip=0.5, actor__optimizer={"lr": -1.0}, gconfig__n_samples=1, rollout__backend="sglang:x1", foo=1
    )
    raw["actor"]["optimzer"] = {}
    found = {i.key: i for i in issues(raw)}
    assert {
        "actor.c_clip",
        "actor.optimizer.lr",
        "gconfig.n_samples",
        "rollout.backend",
        "foo",
        "actor.optimzer",
    } <= set(found)
    assert "did you mean actor.optimizer?" in found["actor.optimzer"].fix
    # a failing section does not cause made-up issues elsewhere
    assert "sglang.model_path" not in found


def test_error_text_names_key_value_rule_and_fix():
    text = str(pytest.raises(ConfigError, validate_config, with_(actor__c_clip=0.9)).value)
    assert "actor.c_clip = 0.9" in text and "> 1.0" in text and "fix:" in text


def test_follow_defaults_are_resolved():
    cfg = validate_config(
        with_(actor__dtype="float32", rollout__backend="sglang:d2t2", seed=5, cluster__n_gpus_per_node=8)
    )
    assert cfg.sglang.dtype == "float32"
    assert cfg.sglang.model_path == "m" and cfg.sglang.tokenizer_path == "m"
    assert cfg.sglang.tp_size == 2 and cfg.sglang.random_seed == 5
    assert cfg.rollout.consumer_batch_size == 8 and cfg.rollout.max_concurrent_rollouts == 8
    explicit = validate_config(with_(actor__dtype="float32", sglang__dtype="bfloat16"))
    assert explicit.sglang.dtype == "bfloat16"  # set means set


def test_streamed_answers_come_incremental_unless_set():
    """Where SGLang streams the answers (rollout.stream_interval, or its auto under a pause mode
    that holds requests), its chunks come incremental (each chunk's new tokens only); set means
    set, and with whole answers the flag stays off (older SGLang lacks it)."""
    assert validate_config(with_()).sglang.incremental_streaming_output is False  # auto is abort: whole
    for mode in ("in_place", "retract"):
        assert validate_config(with_(rollout__pause_mode=mode)).sglang.incremental_streaming_output is True
    whole = with_(rollout__pause_mode="in_place", rollout__stream_interval=None)
    assert validate_config(whole).sglang.incremental_streaming_output is False
    assert validate_config(with_(rollout__stream_interval=16)).sglang.incremental_streaming_output is True
    whole = validate_config(with_(rollout__stream_interval=16, sglang__incremental_streaming_output=False))
    assert whole.sglang.incremental_streaming_output is False


def test_resolved_config_revalidates_unchanged():
    cfg = validate_config(with_(actor__kl_ctl=0.1))
    assert cfg.ref.path == "m"
    again = validate_config(copy.deepcopy(cfg.model_dump()))
    assert again == cfg


def test_config_built_in_python_equals_yaml_one(tmp_path):
    """The path from_pretrained uses (Python objects) gives the same config as YAML + overrides."""
    from areal.config.actor import ActorConfig, OptimizerConfig
    from areal.config.data import DatasetConfig
    from areal.config.rollout import GenerationConfig
    from launcher.compose import compose

    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "actor:\n  path: /models/x\n  dtype: float32\n  optimizer:\n    lr: 3.0e-6\n"
        "train_dataset:\n  path: /data\n  batch_size: 4\ngconfig:\n  n_samples: 2\n"
    )
    from_yaml = validate_config(compose(str(exp), ["actor.c_clip=3.0"]))
    from_python = ExperimentConfig(
        actor=ActorConfig(path="/models/x", dtype="float32", c_clip=3.0, optimizer=OptimizerConfig(lr=3e-6)),
        train_dataset=DatasetConfig(path="/data", batch_size=4),
        gconfig=GenerationConfig(n_samples=2),
    )
    assert validate_config(from_python.model_dump()) == from_yaml


def test_null_dataset_kwargs_are_left_out():
    """A config composing another (calculator_agent_cpu.yaml on the demo) drops an inherited loader
    argument by setting it to null; set, it would be refused as not an argument of that loader."""
    raw = with_(
        train_dataset__type="synthetic_word",
        train_dataset__path=None,
        train_dataset__kwargs={"size": 8, "uniform_answers": None},
    )
    assert validate_config(raw).train_dataset.kwargs == {"size": 8}
    raw["train_dataset"]["kwargs"]["uniform_answers"] = True
    assert [i.key for i in issues(raw)] == ["train_dataset.kwargs.uniform_answers"]


@pytest.mark.parametrize("value, kept", [(16384, 16384), ("4096", 4096), ("auto", "auto"), ("Auto", "auto")])
def test_max_tokens_per_mb_takes_a_token_count_or_auto(value, kept):
    cfg = validate_config(with_(actor__max_tokens_per_mb=value, actor__mb_memory_headroom=0.25))
    assert cfg.actor.max_tokens_per_mb == kept and cfg.actor.mb_memory_headroom == 0.25
    assert validate_config(base()).actor.max_tokens_per_mb == 16384  # nothing changes unless asked


@pytest.mark.parametrize("value", [0, -4096, "lots", "", 1.5, True, None])
def test_max_tokens_per_mb_refuses_anything_else_in_one_issue(value):
    found = issues(with_(actor__max_tokens_per_mb=value))
    assert [i.key for i in found] == ["actor.max_tokens_per_mb"]  # one issue, not one per union member
    assert found[0].value == value
    assert "whole number of tokens >= 1" in found[0].rule and "'auto'" in found[0].rule
    assert found[0].fix.startswith("set actor.max_tokens_per_mb to a valid value")


@pytest.mark.parametrize("value", [-0.1, 1.0, 2])
def test_mb_memory_headroom_is_a_fraction_below_one(value):
    found = issues(with_(actor__max_tokens_per_mb="auto", actor__mb_memory_headroom=value))
    assert [i.key for i in found] == ["actor.mb_memory_headroom"] and found[0].value == value


@pytest.mark.parametrize("value, kept", [("auto", "auto"), (True, True), ("false", False)])
def test_share_prompts_takes_a_boolean_or_auto(value, kept):
    assert validate_config(with_(actor__share_prompts=value)).actor.share_prompts == kept
    assert validate_config(base()).actor.share_prompts == "auto"


@pytest.mark.parametrize("value", ["atuo", 2, [True]])
def test_a_union_typed_key_refuses_anything_else_in_one_issue(value):
    """pydantic reports a value each member of a union refused (share_prompts.bool,
    share_prompts.literal['auto']): one issue names the key and what each member would take."""
    found = issues(with_(actor__share_prompts=value))
    assert [i.key for i in found] == ["actor.share_prompts"] and found[0].value == value
    assert "valid boolean" in found[0].rule and "'auto'" in found[0].rule
    assert found[0].fix.startswith("set actor.share_prompts to a valid value")


def test_an_optional_section_is_not_taken_for_a_union_members_tag():
    from pydantic import BaseModel

    from areal.config.validate import _union_field_depth

    class Inner(BaseModel):
        n: int = 1

    class Outer(BaseModel):
        inner: Inner | None = None
        mode: int | str = 0

    assert _union_field_depth(["inner", "n"], Outer) is None  # a field of the optional section
    assert _union_field_depth(["mode", "int"], Outer) == 1  # a member's tag: the issue is on "mode"
    assert _union_field_depth(["mode"], Outer) is None
