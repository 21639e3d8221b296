"""The model names only this project can load: `tiny:<preset>` and SMOLLM2, built on first use by
areal/models/resolve.py. Torch-free, so the launcher can tell them from folders and hub ids (the
server command line starts SGLang through areal.models.serve for them)."""

from __future__ import annotations

SMOLLM2 = "smollm2:135m-instruct"
TINY_PREFIX = "tiny:"


def is_project_model(path: str) -> bool:
    """A name only this project can load (built on first use), not a folder or hub id."""
    return path == SMOLLM2 or path.startswith(TINY_PREFIX)
