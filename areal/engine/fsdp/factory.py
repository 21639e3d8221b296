"""`FSDPEngine.from_pretrained`: an initialized engine from the config its keywords stand for
(built and validated by areal.config.pretrained_actor, as the YAML path would)."""

from __future__ import annotations

from areal.config.pretrained_actor import pretrained_actor_config


def build_engine(
    cls,
    model: str,
    *,
    total_train_steps: int | None = None,
    initialize: bool = True,
    trainable: bool = True,
    device: str | None = None,
    attn_implementation: str | None = None,
    **kwargs,
):
    """FSDPEngine.from_pretrained(model, *, dp_size, tp_size, dtype, learning_rate, optimizer,
    use_lora, lora_rank, lora_alpha, experiment_name, trial_name, fileroot, total_train_steps,
    **config_overrides): see pretrained_actor_config. The process count must equal dp_size x tp_size
    (torchrun); the mesh built is checked against it."""
    cfg = pretrained_actor_config(model, **kwargs)
    engine = cls(
        cfg.actor,
        experiment_name=cfg.experiment_name,
        trial_name=cfg.trial_name,
        fileroot=cfg.cluster.fileroot,
        trainable=trainable,
        device=device,
        attn_implementation=attn_implementation,
    )
    if initialize:
        engine.initialize(total_train_steps=total_train_steps)
    return engine
