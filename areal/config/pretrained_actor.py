"""The config behind `FSDPEngine.from_pretrained`: the YAML path's config, from keywords.

The arguments become an experiment dict that goes through the same schema (`validate_schema`,
including its "null follows X" resolution) and the actor's cross-field rules, so a notebook user
and `areal-launch` train with identical ActorConfigs. Precedence is explicit: every value may be
given in exactly one way; giving one twice (learning_rate= and lr=, or dp_size= and backend=) is an
error that names both spellings.
"""

from __future__ import annotations

from typing import Any

from .actor import ActorConfig, OptimizerConfig
from .errors import ConfigError, closest_key
from .experiment import ExperimentConfig
from .rules import check_rules
from .validate import validate_schema

# Keyword spellings of from_pretrained -> their place in the ActorConfig.
_NAMED = {
    "dtype": ("dtype",),
    "learning_rate": ("optimizer", "lr"),
    "use_lora": ("use_lora",),
    "lora_rank": ("lora_rank",),
    "lora_alpha": ("lora_alpha",),
}


def pretrained_actor_config(
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
) -> ExperimentConfig:
    """Return the validated ExperimentConfig whose actor section the engine will use.

    config_overrides: any ActorConfig field (e.g. max_tokens_per_mb=4096, backend="fsdp:d4r2")
    or any OptimizerConfig field (e.g. lr=1e-6, lr_scheduler_type="cosine"). Unset arguments
    keep the schema's defaults (dtype defaults to the schema's bfloat16).
    """
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
    _put_named(actor, optim, given)
    _put_overrides(actor, optim, config_overrides, given)
    if dp_size is not None or tp_size is not None:
        _put_parallelism(actor, dp_size, tp_size)
    if optim:
        actor["optimizer"] = optim
    return _validate_actor(_experiment(actor, experiment_name, trial_name, fileroot))


def _put_named(actor: dict, optim: dict, given: dict[str, Any]) -> None:
    """The named keywords that were given, each at its place in the actor or optimizer dict."""
    for kw, value in given.items():
        if value is None:
            continue
        where = _NAMED[kw]
        target = optim if where[0] == "optimizer" else actor
        _put(target, where[-1], value, f"{kw}=", "optimizer=" if target is optim else None)


def _put_overrides(actor: dict, optim: dict, overrides: dict[str, Any], given: dict[str, Any]) -> None:
    """Config overrides by field name: ActorConfig fields go to the actor, OptimizerConfig fields to
    the optimizer; a field also given by a named keyword, or no field at all, is an error."""
    for key, value in overrides.items():
        if key in ActorConfig.model_fields and key != "optimizer":
            clash = next((kw for kw, w in _NAMED.items() if w == (key,) and given[kw] is not None), None)
            if clash or key == "path":
                raise TypeError(f"{key!r} given twice: as {clash or 'model'}= and as a config override; pass it once")
            actor[key] = value
        elif key in OptimizerConfig.model_fields:
            if key == "lr" and given["learning_rate"] is not None:
                raise TypeError("the learning rate is given twice (learning_rate= and lr=); pass one")
            _put(optim, key, value, f"{key}=", "optimizer=")
        else:
            guess = closest_key(key, list(ActorConfig.model_fields) + list(OptimizerConfig.model_fields))
            hint = f"; did you mean {guess!r}?" if guess else ""
            raise TypeError(f"unknown config override {key!r}: not a field of ActorConfig or OptimizerConfig{hint}")


def _put_parallelism(actor: dict, dp_size: int | None, tp_size: int | None) -> None:
    """actor.backend from dp_size/tp_size, which exclude a backend= override."""
    if "backend" in actor:
        raise TypeError(
            "parallelism given twice: dp_size/tp_size and backend=; use backend= alone "
            "for HSDP (e.g. 'fsdp:d4r2') or dp_size/tp_size alone"
        )
    actor["backend"] = f"fsdp:d{dp_size or 1}t{tp_size or 1}"


def _experiment(actor: dict, experiment_name: str | None, trial_name: str | None, fileroot: str | None) -> dict:
    """The experiment dict around the actor section: only the run names and fileroot given."""
    raw: dict[str, Any] = {"actor": actor}
    for key, value in (("experiment_name", experiment_name), ("trial_name", trial_name)):
        if value is not None:
            raw[key] = value
    if fileroot is not None:
        raw["cluster"] = {"fileroot": fileroot}
    return raw


def _validate_actor(raw: dict[str, Any]) -> ExperimentConfig:
    """The schema, its follow-defaults and the cross-field rules about the actor.

    Rules about other sections (datasets, servers, node counts) do not apply to an engine built
    in Python, nor does ppo_n_minibatches' divisibility by the dataset's batch size.
    """
    cfg = validate_schema(raw)
    issues = [i for i in check_rules(cfg) if i.key.startswith("actor.") and i.key != "actor.ppo_n_minibatches"]
    if issues:
        raise ConfigError(issues)
    return cfg


def _put(target: dict, key: str, value: Any, spelling: str, other: str | None) -> None:
    if key in target:
        raise TypeError(f"{key!r} is given twice ({spelling} and {other or 'another argument'}); pass it once")
    target[key] = value
