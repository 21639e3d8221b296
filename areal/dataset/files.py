"""Reading dataset records from local files: jsonl, json and parquet.

Datasets arrive in the layouts people actually have on disk: a `train.jsonl` next to a
`test.jsonl`, a hub snapshot with `main/train-00000-of-00001.parquet`, or a `data/` folder of
shards. `find_split_files` finds the files of one split in such a folder; `read_records` turns
one file into a list of dicts. Parquet needs `pyarrow` (or `pandas`); the error says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SUFFIXES = (".jsonl", ".json", ".parquet")


def read_records(path: str | Path) -> list[dict]:
    """All rows of one .jsonl, .json (a list of objects) or .parquet file, as dicts."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".json":
        return _read_json(path)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    raise ValueError(
        f"cannot read dataset file {path}: unknown suffix {path.suffix!r}; use one of {', '.join(SUFFIXES)}"
    )


def _read_jsonl(path: Path) -> list[dict]:
    """One JSON object per non-empty line; a bad line is reported with its line number."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _read_json(path: Path) -> list[dict]:
    """A JSON file holding a list of objects (or {"data": [...]}, a common wrapper)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{path}: expected a JSON list of objects (or use .jsonl, one per line)")
    return data


def _read_parquet(path: Path) -> list[dict]:
    """Rows of a parquet file through pyarrow, else pandas; a clear error if neither exists."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    if pq is not None:
        return pq.read_table(path).to_pylist()
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(
            f"reading {path} needs pyarrow: pip install pyarrow (or convert the file to .jsonl, which needs nothing)"
        ) from None
    return pd.read_parquet(path).to_dict(orient="records")


def _split_patterns(split: str) -> list[re.Pattern]:
    """File names that hold `split`, most specific first: `train.jsonl`, `train-00000-of-00002.parquet`."""
    s = re.escape(split)
    ext = r"\.(?:jsonl|json|parquet)"
    return [re.compile(rf"{s}{ext}"), re.compile(rf"{s}-\d+-of-\d+{ext}"), re.compile(rf"{s}-[\w.-]*{ext}")]


def find_split_files(directory: str | Path, split: str, subdirs: tuple[str, ...] = ("", "data")) -> list[Path]:
    """Files of `split` in `directory` or the first of its `subdirs` that has any, sorted.

    Subfolders are tried in order, so a hub snapshot with both `main/` and `socratic/` reads
    the config asked for, never a mix. An empty list means nothing matched.
    """
    directory = Path(directory)
    for sub in subdirs:
        folder = directory / sub if sub else directory
        if not folder.is_dir():
            continue
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
        for pattern in _split_patterns(split):
            hits = [folder / n for n in names if pattern.fullmatch(n)]
            if hits:
                return hits
    return []


def list_data_files(directory: str | Path, limit: int = 20) -> list[str]:
    """Relative paths of data files under `directory` (for error messages that show what exists)."""
    directory = Path(directory)
    found = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.suffix in SUFFIXES)
    return found[:limit]
