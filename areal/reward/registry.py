"""Turning a reward spec from the config into a callable.

A spec is a built-in name (see `BUILTIN_REWARDS`) or an import path `package.module:function`,
so users plug their own reward in from YAML without touching this package:

    rollout:
      reward_fn: my_project.rewards:exact_match

Every reward has the signature
`fn(prompt, completion, prompt_ids, completion_ids, **sample_fields) -> float`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

# name -> import path; import paths (not function objects) keep this module import-light and let
# worker processes resolve the same spec by themselves.
BUILTIN_REWARDS = {
    "gsm8k": "areal.reward.gsm8k:gsm8k_reward",
    "arith_shaped": "areal.reward.shaped:arith_shaped_reward",
    "arith_near": "areal.reward.shaped:arith_near_reward",
    "arith_exact": "areal.reward.shaped:arith_exact_reward",
}


def import_object(spec: str, kind: str = "object") -> Any:
    """The attribute named by `package.module:attr` (dots allowed in attr), with a clear error.

    `kind` names what the caller wanted ("reward function", "dataset loader") in the message.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{kind} {spec!r} is not an import path; write it as 'package.module:function'")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(
            f"{kind} {spec!r}: cannot import module {module_name!r} ({e}); check the spelling and "
            "that the module is on PYTHONPATH or installed"
        ) from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{kind} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def resolve_reward_fn(spec: str) -> Callable[..., float]:
    """The reward callable for a built-in name or a `package.module:function` import path."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"reward spec must be a non-empty string, got {spec!r}")
    if ":" not in spec and spec not in BUILTIN_REWARDS:
        raise ValueError(
            f"unknown reward {spec!r}: use one of {sorted(BUILTIN_REWARDS)} or an import path 'package.module:function'"
        )
    fn = import_object(BUILTIN_REWARDS.get(spec, spec), kind="reward function")
    if not callable(fn):
        raise TypeError(f"reward function {spec!r} resolves to a {type(fn).__name__}, which is not callable")
    return fn
