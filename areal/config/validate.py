"""The one validation pass over a merged, resolved config dict.

Pydantic checks types, ranges and unknown keys of every section at once; the cross-field rules in
rules.py then run too, even when some sections failed (those sections are replaced by their
defaults for the rules, and rule issues touching them are dropped), so one run reports everything.
`validate_schema` is the schema part alone, for the configs the engines' from_pretrained build
(pretrained_actor.py, pretrained_client.py), which apply only the rules that concern them.
"""

from __future__ import annotations

import copy
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from .errors import ConfigError, ConfigIssue, closest_key
from .experiment import ExperimentConfig, resolve_follow_defaults
from .rules import check_rules


def validate_config(raw: dict[str, Any]) -> ExperimentConfig:
    """Return the validated, follow-defaults-resolved config or raise ConfigError with every issue."""
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as e:
        issues = _issues_from_pydantic(e.errors())
        failed = [".".join(map(str, err["loc"])) for err in e.errors()]
        issues += _rules_without(raw, e.errors(), failed)
        raise ConfigError(issues) from None
    issues = check_rules(resolve_follow_defaults(cfg))
    if issues:
        raise ConfigError(issues)
    return cfg


def validate_schema(raw: dict[str, Any]) -> ExperimentConfig:
    """The schema alone (types, ranges, unknown keys) and the follow-defaults, without the
    cross-field rules: for a config built in Python for one component (an engine's
    from_pretrained), whose caller applies the rules that concern it. Raises ConfigError with
    every schema issue."""
    try:
        return resolve_follow_defaults(ExperimentConfig.model_validate(raw))
    except ValidationError as e:
        raise ConfigError(_issues_from_pydantic(e.errors())) from None


def _rules_without(raw: dict[str, Any], errors: list[dict], failed: list[str]) -> list[ConfigIssue]:
    """Run the rules on `raw` with every failing value dropped (its default stands in), and keep the
    issues that do not concern a failing key."""
    pruned = copy.deepcopy(raw)
    for err in errors:
        _drop(pruned, [str(p) for p in err["loc"]])
    try:
        cfg = ExperimentConfig.model_validate(pruned)
    except ValidationError:
        return []  # a failure the drop could not isolate: the pydantic issues stand alone
    return [
        i
        for i in check_rules(resolve_follow_defaults(cfg))
        if not any(i.key == f or i.key.startswith(f + ".") or f.startswith(i.key + ".") for f in failed)
    ]


def _drop(tree: Any, loc: list[str]) -> None:
    for depth, part in enumerate(loc):
        if not isinstance(tree, dict) or part not in tree:
            return
        if depth == len(loc) - 1 or not isinstance(tree[part], dict):
            del tree[part]
            return
        tree = tree[part]


def _issues_from_pydantic(errors: list[dict]) -> list[ConfigIssue]:
    """One issue per error, but one per key for a value that matched no member of a union type
    (pydantic reports each member, e.g. actor.share_prompts.bool and actor.share_prompts.literal['auto'])."""
    issues, by_union_key = [], {}
    for err in errors:
        loc = [str(p) for p in err["loc"]]
        depth = _union_field_depth(loc)
        if depth is None:
            issues.append(_issue_from_pydantic(err))
            continue
        key = ".".join(loc[:depth])
        if key not in by_union_key:
            by_union_key[key] = len(issues)
            issues.append(_issue_from_pydantic({**err, "loc": loc[:depth]}))
        else:
            first = issues[by_union_key[key]]
            issues[by_union_key[key]] = ConfigIssue(first.key, first.value, f"{first.rule}, or {err['msg']}", first.fix)
    return issues


def _union_field_depth(loc: list[str], model: type[BaseModel] = ExperimentConfig) -> int | None:
    """How many parts of loc name a field whose type is a union, where loc goes on past it into the
    union's members; None for any other loc."""
    for depth, part in enumerate(loc, start=1):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        if depth < len(loc) and get_origin(ann) in (Union, types.UnionType):
            # an optional section (Model | None) goes on into the model's fields; anything else is a member's tag
            members = [m for m in get_args(ann) if isinstance(m, type) and issubclass(m, BaseModel)]
            inner = [m for m in members if loc[depth] in m.model_fields]
            if not inner:
                return depth
            ann = inner[0]
        model = ann
    return None


def _issue_from_pydantic(err: dict) -> ConfigIssue:
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc)
    if err["type"] == "extra_forbidden":
        return ConfigIssue(key, err.get("input"), "unknown key", _unknown_key_fix(loc))
    model, field = _field_of(loc)
    hint = f" ({field.description})" if field is not None and field.description else ""
    return ConfigIssue(key, err.get("input"), err["msg"], f"set {key} to a valid value{hint}")


def _unknown_key_fix(loc: list[str]) -> str:
    parent, _ = _field_of(loc[:-1]) if len(loc) > 1 else (ExperimentConfig, None)
    names = parent.model_fields if isinstance(parent, type) and issubclass(parent, BaseModel) else {}
    prefix = ".".join(loc[:-1] + [""])
    guess = closest_key(loc[-1], names)
    if guess:
        return f"did you mean {prefix}{guess}?"
    return f"remove it; valid keys here: {', '.join(sorted(names)) or '(none)'}"


def _field_of(loc: list[str]):
    """Walk the schema along loc; returns (model owning the last part's type, FieldInfo of the last part)."""
    model, field = ExperimentConfig, None
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return model, field
        field = model.model_fields[part]
        ann = field.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return model, field
