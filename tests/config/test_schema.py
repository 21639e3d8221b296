"""The schema is the single source of truth: typed, defaulted, described, strict."""

from pydantic import BaseModel

from areal.config import ExperimentConfig
from areal.config.base import Section


def _walk(model, prefix=""):
    for name, field in model.model_fields.items():
        yield prefix + name, model, field
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _walk(ann, prefix + name + ".")


def test_every_field_is_described_and_defaulted():
    for key, _, field in _walk(ExperimentConfig):
        assert field.description, f"{key} has no description"
        assert not field.is_required(), f"{key} has no default"


def test_every_section_forbids_unknown_keys():
    for key, model, _ in _walk(ExperimentConfig):
        assert issubclass(model, Section) and model.model_config["extra"] == "forbid", key


def test_schema_covers_the_mission():
    keys = {k for k, _, _ in _walk(ExperimentConfig)}
    for needed in [
        "experiment_name",
        "trial_name",
        "seed",
        "total_train_epochs",
        "total_train_steps",
        "cluster.fileroot",
        "cluster.n_nodes",
        "cluster.n_gpus_per_node",
        "cluster.device",
        "cluster.name_resolve.record_root",
        "launcher.backend",
        "launcher.ray_address",
        "launcher.trainer_n_nodes",
        "launcher.rollout_n_nodes",
        "launcher.trainer_env",
        "launcher.server_startup_timeout_s",
        "actor.path",
        "actor.backend",
        "actor.dtype",
        "actor.grad_reduce_dtype",
        "actor.optimizer.lr",
        "actor.optimizer.lr_scheduler_type",
        "actor.optimizer.warmup_steps_proportion",
        "actor.optimizer.gradient_clipping",
        "actor.max_tokens_per_mb",
        "actor.gradient_checkpointing",
        "actor.use_lora",
        "actor.lora_rank",
        "actor.lora_alpha",
        "actor.target_modules",
        "actor.eps_clip",
        "actor.c_clip",
        "actor.ppo_n_minibatches",
        "actor.reward_scaling",
        "actor.reward_bias",
        "actor.reward_clip",
        "actor.kl_ctl",
        "actor.recompute_logprob",
        "actor.use_decoupled_loss",
        "actor.behav_imp_weight_cap",
        "actor.adv_norm",
        "ref.path",
        "rollout.backend",
        "rollout.max_concurrent_rollouts",
        "rollout.consumer_batch_size",
        "rollout.max_head_offpolicyness",
        "rollout.request_timeout_s",
        "rollout.request_retries",
        "rollout.setup_timeout_s",
        "rollout.server_addrs",
        "rollout.replay_path",
        "rollout.server",
        "gconfig.n_samples",
        "gconfig.max_new_tokens",
        "gconfig.temperature",
        "gconfig.top_p",
        "gconfig.stop",
        "sglang.dtype",
        "sglang.context_length",
        "train_dataset.path",
        "valid_dataset.path",
        "saver.freq_steps",
        "evaluator.freq_steps",
        "stats_logger.tensorboard",
        "recover.mode",
    ]:
        assert needed in keys, needed


def test_defaults_round_trip_through_a_dump():
    cfg = ExperimentConfig()
    assert ExperimentConfig.model_validate(cfg.model_dump()) == cfg
