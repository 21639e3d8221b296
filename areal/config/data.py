"""Datasets the trainer and the evaluator read."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from .base import Section

# Every built-in DatasetConfig.type and the import path of its loader: the one table that the rules
# check names against and areal/dataset/registry.py loads from (paths keep the schema free of the
# loaders' imports). 'files' has no loader there: the trainer reads those rows itself.
BUILTIN_DATASETS: dict[str, str | None] = {
    "gsm8k": "areal.dataset.gsm8k:load_gsm8k_split",
    "synthetic_arith": "areal.dataset.synthetic:load_synthetic_arith",
    "synthetic_word": "areal.dataset.word_problems:load_word_problems",
    "files": None,
}
# generated in Python: they take no path, and their kwargs are checked before launch
GENERATED_DATASETS = ("synthetic_arith", "synthetic_word")


class DatasetConfig(Section):
    type: str = Field(
        "gsm8k",
        description="Loader: 'gsm8k' (path = local folder/file or hub id; null: $AREAL_GSM8K_DIR, else "
        "openai/gsm8k), 'synthetic_arith' (the CPU demo task, generated), 'synthetic_word' (easy generated "
        "GSM8K-style word problems), 'files' (jsonl/json/parquet rows "
        "at path, as they are), or 'package.module:function' returning a list of dicts.",
    )
    path: str | None = Field(None, description="Where the loader reads from (see type).")
    split: str = Field("train", description="Split to read.")
    batch_size: int = Field(8, ge=1, description="Prompts per training step (or per evaluation batch).")
    shuffle: bool = Field(True, description="Shuffle every epoch (seeded).")
    max_prompt_len: int | None = Field(
        None,
        ge=1,
        description="Drop records whose prompt is longer than this many tokens (the chat prompt "
        "the workflow sends: template and workflow.system_prompt included); null keeps all.",
    )
    max_samples: int | None = Field(None, ge=1, description="Use only the first N records (debugging).")
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra loader arguments. One set to null is left out, so a config "
        "that composes another drops an inherited argument its own loader does not take.",
    )

    @field_validator("kwargs")
    @classmethod
    def _drop_nulls(cls, value: dict[str, Any]) -> dict[str, Any]:
        return {key: item for key, item in value.items() if item is not None}
