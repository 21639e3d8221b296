"""GSM8K: load the dataset from wherever it is and build chat prompts from its questions.

`load_gsm8k(path, split)` accepts what users have:

- a local folder: `train.jsonl` / `test.jsonl`, `train-00000-of-00001.parquet`, or a hub
  snapshot with `main/train-*.parquet` (the `config` subfolder is preferred) or `data/`;
- a single .jsonl / .json / .parquet file (the split argument is then ignored);
- a hub id such as `openai/gsm8k` (config `main`), through the `datasets` library.

Every record comes back as {"question", "answer", "solution"}, where `solution` is the number
after the answer's `#### ` marker, normalized ("1,234" -> "1234"): the reward compares to it.

    python -m areal.dataset.gsm8k ../shared/data/gsm8k test     # print a count and one record
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from areal.chat.template import encode_text
from areal.dataset.files import find_split_files, list_data_files, read_records
from areal.reward.gsm8k import extract_hash_answer

HUB_ID = "openai/gsm8k"
GSM8K_DIR_ENV = "AREAL_GSM8K_DIR"


def load_gsm8k(path: str, split: str = "train", *, config: str = "main", shortest: int | None = None) -> list[dict]:
    """GSM8K records of `split` from a local folder, a single file, or a hub id.

    shortest=N keeps the N records with the shortest questions (in their original order): the
    easy end of GSM8K, where a small model scores above zero and RL has a signal to follow.
    """
    local = Path(path).expanduser()
    if local.is_file():
        rows, source = read_records(local), str(local)
    elif local.is_dir():
        rows, source = _read_local_split(local, split, config), f"{local} (split {split!r})"
    else:
        rows, source = _read_hub(path, split, config), f"{path} (hub, split {split!r})"
    records = [_to_record(row, source, i) for i, row in enumerate(rows)]
    if shortest is not None:
        if shortest < 1:
            raise ValueError(f"gsm8k kwargs.shortest={shortest}: must be a positive number of records")
        keep = sorted(range(len(records)), key=lambda i: (len(records[i]["question"]), i))[:shortest]
        records = [records[i] for i in sorted(keep)]
    return records


def load_gsm8k_split(split: str = "train", *, path: str | None = None, **kwargs) -> list[dict]:
    """The registry entry point (dataset type `gsm8k`): from `path`, else $AREAL_GSM8K_DIR, else the hub."""
    return load_gsm8k(path or os.environ.get(GSM8K_DIR_ENV) or HUB_ID, split, **kwargs)


def _read_local_split(folder: Path, split: str, config: str) -> list[dict]:
    """All rows of `split` in a local folder; the error lists the data files it did find."""
    files = find_split_files(folder, split, subdirs=("", config, "data", f"{config}/data"))
    if not files:
        seen = list_data_files(folder)
        raise FileNotFoundError(
            f"no {split!r} split in {folder}: expected a file like {split}.jsonl, "
            f"{split}.parquet or {config}/{split}-00000-of-00001.parquet; "
            f"data files found there: {seen or 'none'}"
        )
    return [row for f in files for row in read_records(f)]


def _read_hub(path: str, split: str, config: str) -> list[dict]:
    """Rows from the Hugging Face hub via `datasets`; errors say to use a local folder instead."""

    def not_found(why: str) -> FileNotFoundError:
        return FileNotFoundError(
            f"dataset path {path!r} is not a local file or folder, and loading it from the hub "
            f"{why}. Point the path at a local folder with train/test .jsonl or .parquet files "
            "(for example ../shared/data/gsm8k) or a single file."
        )

    try:
        import datasets
    except ImportError:
        raise not_found("needs the `datasets` package (pip install datasets)") from None
    try:
        ds = datasets.load_dataset(path, config, split=split)
    except Exception as e:  # offline, unknown id, unknown split: all mean "use a local copy"
        raise not_found(f"failed ({type(e).__name__}: {e})") from e
    return [dict(row) for row in ds]


def _to_record(row: dict, source: str, index: int) -> dict:
    """{"question", "answer", "solution"} from one raw row; a row without them is a user error."""
    missing = [k for k in ("question", "answer") if not isinstance(row.get(k), str)]
    if missing:
        raise ValueError(
            f"{source}: row {index} has no text field(s) {missing}; GSM8K rows need 'question' "
            f"and 'answer' (ending in '#### N'); its keys are {sorted(row)}"
        )
    solution = row.get("solution")
    if solution in (None, ""):
        solution = extract_hash_answer(row["answer"])
    if solution is None:
        raise ValueError(f"{source}: row {index} has an answer without a final '#### N' line: {row['answer'][-80:]!r}")
    return {"question": row["question"], "answer": row["answer"], "solution": str(solution)}


def build_prompt(tokenizer, question: str, system_prompt: str | None = None) -> list[int]:
    """Token ids of `question` as a user turn, through the tokenizer's chat template.

    Renders text first and tokenizes it without special tokens: with transformers 5,
    `apply_chat_template(tokenize=True)` returns a BatchEncoding rather than ids, and the
    template already holds the bos/eos the model expects, so adding them again would double them.
    """
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": question})
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} has no "
            "chat template; use an instruct model or set tokenizer.chat_template"
        )
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return encode_text(tokenizer, text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Load GSM8K and print its size and first record.")
    parser.add_argument("path", help="local folder, file, or hub id (openai/gsm8k)")
    parser.add_argument("split", nargs="?", default="train")
    args = parser.parse_args(argv)
    records = load_gsm8k(args.path, args.split)
    print(f"{len(records)} records")
    print(json.dumps(records[0], indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
