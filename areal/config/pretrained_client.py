"""The config behind RemoteSGLangEngine.from_pretrained: the YAML path's config, from keywords.

`pretrained_client_config(model, dp_size=2, gconfig={"max_new_tokens": 64})` builds the same raw
dict a YAML file with those values would give and validates it with `validate_config`, so the
engine sees exactly the ExperimentConfig the launcher would build. Overrides may be dotted
(`**{"rollout.request_timeout_s": 60}`) or nested (`rollout={"request_timeout_s": 60}`); a key set
twice to different values (e.g. `model` and `actor={"path": ...}`) is an error naming both.

Validation issues outside what a client uses (e.g. train_dataset.path, required by the launcher
when it starts a full run) are not errors here: a client for generation needs no dataset.
Whether this machine can start the servers such a config asks for is the engine's check
(areal/engine/sglang/pretrained.py).
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import ConfigError
from .experiment import ExperimentConfig
from .parallel import ParallelStrategyError, parse_parallel
from .validate import validate_config, validate_schema

# Top-level keys whose issues concern a client; issues elsewhere are launch-plan matters.
CLIENT_KEYS = ("rollout", "sglang", "gconfig", "workflow", "cluster", "experiment_name", "trial_name", "seed")
_MISSING = object()


def pretrained_client_config(
    model: str,
    *,
    tokenizer_path: str | None = None,
    dp_size: int | None = None,
    tp_size: int | None = None,
    server_addrs: list[str] | None = None,
    max_concurrent_rollouts: int | None = None,
    **overrides,
) -> ExperimentConfig:
    """The validated ExperimentConfig for RemoteSGLangEngine.from_pretrained (see its docstring)."""
    raw = overrides_to_raw(overrides)
    _put(raw, "actor.path", model, "model")
    if tokenizer_path is not None:
        _put(raw, "actor.tokenizer_path", tokenizer_path, "tokenizer_path")
    if server_addrs is not None:
        _put(raw, "rollout.server_addrs", list(server_addrs), "server_addrs")
    if max_concurrent_rollouts is not None:
        _put(raw, "rollout.max_concurrent_rollouts", max_concurrent_rollouts, "max_concurrent_rollouts")
    _set_backend(raw, dp_size, tp_size)
    return _validate_for_client(raw)


def overrides_to_raw(overrides: dict[str, Any]) -> dict[str, Any]:
    """Nested dict of dotted and nested keyword overrides, merged deeply."""
    raw: dict[str, Any] = {}
    for key, value in overrides.items():
        if "." in key:
            _put(raw, key, copy.deepcopy(value), key)
        elif isinstance(value, dict):
            for sub, v in _flatten(value, key):
                _put(raw, sub, v, key)
        else:
            _put(raw, key, copy.deepcopy(value), key)
    return raw


def _flatten(tree: dict, prefix: str):
    for k, v in tree.items():
        path = f"{prefix}.{k}"
        if isinstance(v, dict) and v:
            yield from _flatten(v, path)
        else:
            yield path, copy.deepcopy(v)


def _get(raw: dict, dotted: str, default=None):
    node = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _put(raw: dict, dotted: str, value: Any, origin: str) -> None:
    """Set a dotted key; a second, different value for it is an error naming both sources."""
    *parents, last = dotted.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"from_pretrained: {dotted} cannot be set: {part} is not a section")
    old = node.get(last, _MISSING)
    if old is not _MISSING and old != value:
        raise ValueError(
            f"from_pretrained: {dotted} is given twice with different values "
            f"({old!r} and {value!r} from {origin}); pass it once"
        )
    node[last] = value


def _set_backend(raw: dict, dp_size: int | None, tp_size: int | None) -> None:
    """rollout.backend = sglang:d{dp}t{tp}, consistent with server_addrs and any given backend."""
    given = _get(raw, "rollout.backend")
    given_dp = given_tp = None
    if given is not None:
        try:
            st = parse_parallel(given, allowed_backends=("sglang",))
            given_dp, given_tp = st.dp, st.tp
        except ParallelStrategyError:
            return  # validation reports it under rollout.backend
    addrs = _get(raw, "rollout.server_addrs") or []
    dp = dp_size or given_dp or (len(addrs) if addrs else 1)
    tp = tp_size or given_tp or 1
    if addrs and len(addrs) != dp:
        raise ValueError(
            f"from_pretrained: dp_size={dp} but {len(addrs)} server_addrs were given "
            f"({', '.join(addrs)}); pass dp_size={len(addrs)} or that many addresses"
        )
    if given is not None:
        _put(raw, "rollout.backend", f"sglang:d{dp}t{tp}", "dp_size/tp_size")
    else:
        raw.setdefault("rollout", {})["backend"] = f"sglang:d{dp}t{tp}"


def _validate_for_client(raw: dict) -> ExperimentConfig:
    try:
        return validate_config(raw)
    except ConfigError as e:
        relevant = [i for i in e.issues if i.key.split(".")[0] in CLIENT_KEYS]
        if relevant:
            raise ConfigError(relevant) from None
        try:
            return validate_schema(raw)
        except Exception:
            raise e from None
