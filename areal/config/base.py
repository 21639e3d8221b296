"""Shared pieces of the config schema: the strict base model and small field types.

No torch import here: the launcher validates configs on machines without the training stack.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

DType = Literal["bfloat16", "float16", "float32"]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=False)
