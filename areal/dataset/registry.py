"""One entry point for every dataset a config can name.

    load_dataset_by_name(spec: str, split: str = "train", *, path: str | None = None,
                         **kwargs) -> list[dict]

`spec` is one of:

- a built-in name:
    `gsm8k`            GSM8K from `path` (a local folder, file or hub id); when `path` is
                       omitted, from $AREAL_GSM8K_DIR, else the hub id `openai/gsm8k`.
    `synthetic_arith`  the CPU demo task; kwargs `size`, `seed`, `max_sum`, `max_operand`,
                       `balanced` (every problem equally often), `uniform_answers` (every
                       sum equally often).
    `synthetic_word`   easy generated GSM8K-style word problems (areal.dataset.word_problems);
                       kwargs `size`, `seed`, `balanced` (every template equally often).
- an import path `package.module:function`: your own loader, called as
  `function(split=split, **kwargs)` (plus `path=path` when a path is given); it must return a
  list of dicts. This is how a YAML config plugs in a dataset:

      train_dataset:
        name: my_project.data:load_problems
        split: train

- a local file or folder of .jsonl/.json/.parquet files: rows are returned as they are, and
  rows in GSM8K's shape (`question` plus an `answer` ending in `#### N`) gain a `solution`
  field, so the built-in rewards work on them.
- a hub id (`owner/name`): GSM8K-shaped datasets via `datasets.load_dataset`.

Workflows read the prompt from a record's `question` field by default; the whole record is
handed to the reward function as keyword arguments.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

from areal.config.data import BUILTIN_DATASETS, GENERATED_DATASETS
from areal.dataset.files import find_split_files, list_data_files, read_records
from areal.dataset.gsm8k import load_gsm8k
from areal.reward.gsm8k import extract_hash_answer
from areal.reward.registry import import_object

# the built-in names loaded here ('files' has no loader: the trainer reads those rows itself)
_LOADABLE = [name for name, loader in BUILTIN_DATASETS.items() if loader]


def load_dataset_by_name(spec: str, split: str = "train", *, path: str | None = None, **kwargs) -> list[dict]:
    """The records of `split` named by `spec` (see the module docstring for the forms)."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"dataset spec must be a non-empty string, got {spec!r}")
    if BUILTIN_DATASETS.get(spec):
        return _load_builtin(spec, split, path, kwargs)
    if ":" in spec and not Path(spec).exists():
        return _load_by_import_path(spec, split, path, kwargs)
    if Path(spec).expanduser().exists():
        return _load_local(Path(spec).expanduser(), split)
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return load_gsm8k(spec, split, **kwargs)  # hub id; the error explains local alternatives
    raise ValueError(
        f"unknown dataset {spec!r}: not a built-in name ({', '.join(sorted(_LOADABLE))}), "
        "an existing file or folder, a hub id 'owner/name', or an import path 'package.module:function'"
    )


def _load_builtin(name: str, split: str, path: str | None, kwargs: dict) -> list[dict]:
    """A built-in loader (areal.config.data.BUILTIN_DATASETS); the generated ones take no path."""
    loader = import_object(BUILTIN_DATASETS[name], kind="dataset loader")
    if name not in GENERATED_DATASETS:
        return loader(split, path=path, **kwargs)
    if path:
        raise ValueError(f"dataset '{name}' is generated and takes no path (got {path!r})")
    return loader(split, **kwargs)


def _load_by_import_path(spec: str, split: str, path: str | None, kwargs: dict) -> list[dict]:
    """Call a user loader and check it returned a list of dicts."""
    loader = import_object(spec, kind="dataset loader")
    if not callable(loader):
        raise TypeError(f"dataset loader {spec!r} is a {type(loader).__name__}, not a function")
    if path is not None:
        kwargs = {**kwargs, "path": path}
    _check_arguments(spec, loader, split, kwargs)
    records = loader(split=split, **kwargs)
    records = list(records) if not isinstance(records, list) else records
    bad = next((i for i, r in enumerate(records) if not isinstance(r, dict)), None)
    if bad is not None:
        raise TypeError(
            f"dataset loader {spec!r} must return a list of dicts; item {bad} is a {type(records[bad]).__name__}"
        )
    return records


def _check_arguments(spec: str, loader: Callable, split: str, kwargs: dict) -> None:
    """Refuse arguments the loader does not take before calling it, naming them and the way out
    (a kwarg inherited from a composed config, e.g. the demo's, is dropped by setting it to null)."""
    try:
        signature = inspect.signature(loader)
    except (TypeError, ValueError):  # no signature to read (some builtins): let the call decide
        return
    try:
        signature.bind(split=split, **kwargs)
    except TypeError as exc:
        raise TypeError(
            f"dataset loader {spec!r} cannot be called with split and kwargs {sorted(kwargs)}: {exc}. "
            "Fix the dataset's kwargs; one inherited from a composed config is left out by setting it "
            "to null (e.g. train_dataset.kwargs.NAME=null)"
        ) from None


def _load_local(path: Path, split: str) -> list[dict]:
    """Rows of a local file, or of `split` in a local folder, GSM8K-shaped rows given a solution."""
    if path.is_file():
        rows = read_records(path)
    else:
        files = find_split_files(path, split, subdirs=("", "main", "data"))
        if not files:
            raise FileNotFoundError(
                f"no {split!r} split in {path}: expected {split}.jsonl, {split}.parquet or "
                f"{split}-00000-of-00001.parquet; data files there: {list_data_files(path) or 'none'}"
            )
        rows = [row for f in files for row in read_records(f)]
    return [_with_solution(row) for row in rows]


def _with_solution(row: dict) -> dict:
    """Add `solution` to a GSM8K-shaped row that lacks one; leave other rows untouched."""
    if "solution" in row or not isinstance(row.get("answer"), str):
        return row
    solution = extract_hash_answer(row["answer"])
    return {**row, "solution": solution} if solution is not None else row
