"""`FSDPEngine.from_pretrained`: the Python entry point that builds the same config as the YAML path.

The arguments become an experiment dict that goes through the same schema
(`ExperimentConfig.model_validate`, including its "null follows X" resolution), so a notebook user
and `areal-launch` train with identical ActorConfigs. Precedence is explicit: every value may be
given in exactly one way; giving one twice (learning_rate= and lr=, or dp_size= and backend=) is an
error that names both spellings.
"""

from __future__ import annotations

from typing import Any

from areal.config.errors import closest_key

# Keyword spellings of this function -> their place in the ActorConfig.
_NAMED = {
    "dtype": ("dtype",),
    "learning_rate": ("optimizer", "lr"),
    "use_lora": ("use_lora",),
    "lora_rank": ("lora_rank",),
    "lora_alpha": ("lora_alpha",),
}


def build_configs(
    model: str,
    *,
    dp_size: int | None = None,
    tp_size: int | None = None,
    dtype: str | None = None,
    learning_rate: float | None = None,
    optimizer: dict | Any | None = None,
    use_lora: bool | None = None,
    lora_rank: int | None = None,
    lora_alpha: int | None = None,
    experiment_name: str | None = None,
    trial_name: str | None = None,
    fileroot: str | None = None,
    **config_overrides,
):
    """Return the validated ExperimentConfig whose actor section the engine will use.

    config_overrides: any ActorConfig field (e.g. max_tokens_per_mb=4096, backend="fsdp:d4r2")
    or any OptimizerConfig field (e.g. lr=1e-6, lr_scheduler_type="cosine"). Unset arguments
    keep the schema's defaults (dtype defaults to the schema's bfloat16).
    """
    from areal.config.actor import ActorConfig, OptimizerConfig

    actor: dict[str, Any] = {"path": model}
    optim: dict[str, Any] = {}
    if optimizer is not None:
        optim.update(optimizer.model_dump() if hasattr(optimizer, "model_dump") else dict(optimizer))
    given = {
        "dtype": dtype,
        "learning_rate": learning_rate,
        "use_lora": use_lora,
        "lora_rank": lora_rank,
        "lora_alpha": lora_alpha,
    }
    for kw, value in given.items():
        if value is None:
            continue
        where = _NAMED[kw]
        target = optim if where[0] == "optimizer" else actor
        _put(target, where[-1], value, f"{kw}=", "optimizer=" if target is optim else None)
    for key, value in config_overrides.items():
        if key in ActorConfig.model_fields and key != "optimizer":
            clash = next((kw for kw, w in _NAMED.items() if w == (key,) and given[kw] is not None), None)
            if clash or key == "path":
                raise TypeError(f"{key!r} given twice: as {clash or 'model'}= and as a config override; pass it once")
            actor[key] = value
        elif key in OptimizerConfig.model_fields:
            if key == "lr" and learning_rate is not None:
                raise TypeError("the learning rate is given twice (learning_rate= and lr=); pass one")
            _put(optim, key, value, f"{key}=", "optimizer=")
        else:
            guess = closest_key(key, list(ActorConfig.model_fields) + list(OptimizerConfig.model_fields))
            hint = f"; did you mean {guess!r}?" if guess else ""
            raise TypeError(f"unknown config override {key!r}: not a field of ActorConfig or OptimizerConfig{hint}")
    if dp_size is not None or tp_size is not None:
        if "backend" in actor:
            raise TypeError(
                "parallelism given twice: dp_size/tp_size and backend=; use backend= alone "
                "for HSDP (e.g. 'fsdp:d4r2') or dp_size/tp_size alone"
            )
        actor["backend"] = f"fsdp:d{dp_size or 1}t{tp_size or 1}"
    if optim:
        actor["optimizer"] = optim
    raw: dict[str, Any] = {"actor": actor}
    for key, value in (("experiment_name", experiment_name), ("trial_name", trial_name)):
        if value is not None:
            raw[key] = value
    if fileroot is not None:
        raw["cluster"] = {"fileroot": fileroot}
    return _validate(raw)


def _validate(raw: dict[str, Any]):
    """The schema, its follow-defaults and the cross-field rules about the actor.

    Rules about other sections (datasets, servers, node counts) do not apply to an engine built
    in Python, nor does ppo_n_minibatches' divisibility by the dataset's batch size.
    """
    from pydantic import ValidationError

    from areal.config.errors import ConfigError
    from areal.config.experiment import ExperimentConfig, resolve_follow_defaults
    from areal.config.rules import check_rules
    from areal.config.validate import _issue_from_pydantic

    try:
        cfg = resolve_follow_defaults(ExperimentConfig.model_validate(raw))
    except ValidationError as e:
        raise ConfigError([_issue_from_pydantic(err) for err in e.errors()]) from None
    issues = [i for i in check_rules(cfg) if i.key.startswith("actor.") and i.key != "actor.ppo_n_minibatches"]
    if issues:
        raise ConfigError(issues)
    return cfg


def _put(target: dict, key: str, value: Any, spelling: str, other: str | None) -> None:
    if key in target:
        raise TypeError(f"{key!r} is given twice ({spelling} and {other or 'another argument'}); pass it once")
    target[key] = value


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
    **config_overrides): see build_configs. The process count must equal dp_size x tp_size
    (torchrun); the mesh built is checked against it."""
    cfg = build_configs(model, **kwargs)
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
