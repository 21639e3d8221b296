"""The config FSDPEngine.from_pretrained builds from keywords: the YAML path's, with clear errors
for a value given twice or a misspelt override."""

import pytest

from areal.config.pretrained_actor import pretrained_actor_config


def test_from_pretrained_config_equals_yaml_path():
    from areal.config.validate import validate_config

    yaml_cfg = validate_config(
        {
            "experiment_name": "e",
            "trial_name": "t",
            "train_dataset": {"path": "synthetic:arith"},
            "actor": {
                "path": "/m",
                "backend": "fsdp:d2t2",
                "dtype": "float32",
                "use_lora": True,
                "lora_rank": 8,
                "lora_alpha": 16,
                "max_tokens_per_mb": 4096,
                "c_clip": 3.0,
                "optimizer": {"lr": 1e-4, "lr_scheduler_type": "cosine"},
            },
        }
    )
    py_cfg = pretrained_actor_config(
        "/m",
        dp_size=2,
        tp_size=2,
        dtype="float32",
        learning_rate=1e-4,
        use_lora=True,
        lora_rank=8,
        lora_alpha=16,
        experiment_name="e",
        trial_name="t",
        max_tokens_per_mb=4096,
        c_clip=3.0,
        lr_scheduler_type="cosine",
    )
    assert py_cfg.actor == yaml_cfg.actor
    assert (py_cfg.experiment_name, py_cfg.trial_name) == ("e", "t")


def test_from_pretrained_defaults_names_for_disk_updates():
    cfg = pretrained_actor_config("/m")
    assert cfg.experiment_name and cfg.trial_name and cfg.cluster.fileroot
    assert cfg.actor.backend == "fsdp:d1" and cfg.actor.dtype == "bfloat16"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(learning_rate=1e-4, lr=1e-5), "learning rate is given twice"),
        (dict(learning_rate=1e-4, optimizer={"lr": 1e-5}), "'lr' is given twice"),
        (dict(dp_size=2, backend="fsdp:d4"), "parallelism given twice"),
        (dict(dtype="float32", **{"dtype_": 1}), "did you mean 'dtype'"),
        (dict(lerning_rate=1e-4), "unknown config override 'lerning_rate'"),
    ],
)
def test_from_pretrained_conflicts_are_clear(kwargs, message):
    with pytest.raises(TypeError, match=message):
        pretrained_actor_config("/m", **kwargs)


def test_from_pretrained_overrides_go_through_rules():
    from areal.config.errors import ConfigError

    with pytest.raises(ConfigError, match="actor.c_clip"):
        pretrained_actor_config("/m", c_clip=0.5)
    cfg = pretrained_actor_config("/m", backend="fsdp:d4r2", weight_decay=0.1, optimizer={"beta2": 0.95})
    assert cfg.actor.backend == "fsdp:d4r2"
    assert (cfg.actor.optimizer.weight_decay, cfg.actor.optimizer.beta2) == (0.1, 0.95)
