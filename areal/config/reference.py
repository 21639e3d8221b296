"""Render the config reference (docs/config_reference.md) from the schema's own descriptions.

python scripts/gen_config_reference.py          # rewrite docs/config_reference.md
"""

from __future__ import annotations

import json
import types
import typing

from pydantic import BaseModel

from .experiment import ExperimentConfig


def _default_text(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        value = value.model_dump() if isinstance(value, BaseModel) else value
    else:
        value = field.default
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        return "(section)"
    return f"`{json.dumps(value)}`"


def _type_text(field) -> str:
    text = _annotation_text(field.annotation)
    return text.replace("|", "\\|")


def _annotation_text(ann) -> str:
    """Readable types: Literal choices spelt out, unions joined with |."""
    args = typing.get_args(ann)
    if typing.get_origin(ann) is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if args and typing.get_origin(ann) in (types.UnionType, typing.Union):
        return " | ".join(_annotation_text(a) for a in args)
    if typing.get_origin(ann) is typing.Annotated:
        return _annotation_text(args[0])
    if args:
        return f"{typing.get_origin(ann).__name__}[{', '.join(_annotation_text(a) for a in args)}]"
    return "null" if ann is type(None) else getattr(ann, "__name__", str(ann))


def _rows(model, prefix=""):
    sections = []
    rows = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            sections.append((prefix + name, ann, field.description))
        else:
            rows.append(f"| `{prefix}{name}` | {_type_text(field)} | {_default_text(field)} | {field.description} |")
    return rows, sections


def render_reference() -> str:
    out = [
        "# Config reference",
        "",
        "Generated from the pydantic schema (`areal/config/`) by `scripts/gen_config_reference.py`;",
        "do not edit by hand. Every key can be overridden on the command line, e.g.",
        "`areal-launch --config gsm8k_grpo.yaml actor.optimizer.lr=1e-6`.",
        "",
    ]
    queue = [("", ExperimentConfig, "Run-wide values.")]
    while queue:
        prefix, model, description = queue.pop(0)
        rows, sections = _rows(model, prefix + "." if prefix else "")
        out += [
            f"## `{prefix or '(top level)'}`",
            "",
            description or "",
            "",
            "| key | type | default | description |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
        ]
        queue = sections + queue
    return "\n".join(out)
