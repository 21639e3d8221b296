"""Which prompts each training step trained on: `RUN/prompts.jsonl`, one line per step,

    {"step": 3, "record_ids": [17, 4, 230, ...]}

one id per group of gconfig.n_samples rows (one GRPO group: one episode of an RLVR or
conversation-mode agent workflow; a call-mode agent episode counts max_calls times), in batch
order. An id is the record's index in the training dataset (PromptLoader.record_id), the same in
every run of the same data config, so two runs can be compared: a run that was killed and
recovered (recover.mode=auto) must have trained on the same multiset of prompts as one that was
not. Batches without ids (old saved rollouts, a custom dataloader) leave no line.

Rank 0 writes it; a recovered run first drops the lines of steps it redoes, as metrics.jsonl.

    python -m areal.trainer.prompt_log RUN_A RUN_B    # compare two runs' prompt multisets
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

FILE = "prompts.jsonl"


def record_ids_of(batch: dict[str, Any], group_size: int) -> list[int] | None:
    """One record id per group of `group_size` rows of a batch, or None when it has none."""
    ids = batch.get("record_id")
    if ids is None:
        return None
    rows = [int(x) for x in ids.tolist()]
    return rows[:: max(1, group_size)]


class PromptLog:
    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / FILE

    def append(self, step: int, record_ids: list[int]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "record_ids": record_ids}) + "\n")

    def drop_from(self, step: int) -> int:
        """Remove lines of steps >= step (a recovered run redoes them); returns how many went."""
        if not self.path.exists():
            return 0
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _step_of(line) is not None and _step_of(line) < step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        tmp.replace(self.path)
        return len(lines) - len(kept)


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a line cut short by a kill: not a trained step


def read_prompts(run_dir: str | Path) -> dict[int, list[int]]:
    """step -> record ids of a run's prompts.jsonl ({} when it has none). A later line of the
    same step wins (there is none after a recovery's drop)."""
    path = Path(run_dir) / FILE
    out: dict[int, list[int]] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            out[int(row["step"])] = [int(i) for i in row["record_ids"]]
        except (ValueError, KeyError, TypeError):
            continue  # the last line of a killed run may be cut short
    return out


def compare_prompts(run_a: str | Path, run_b: str | Path, steps: range | None = None) -> list[str]:
    """The differences between two runs' prompt multisets over `steps` (default: every step
    either logged; differing step sets are a difference too): [] when they trained on the same
    prompts, each as often."""
    a, b = read_prompts(run_a), read_prompts(run_b)
    problems = []
    if steps is None:
        if sorted(a) != sorted(b):
            problems.append(f"steps differ: {run_a} logged {_span(a)}, {run_b} logged {_span(b)}")
        steps = sorted(set(a) & set(b))
    else:
        for name, rows in ((run_a, a), (run_b, b)):
            missing = [s for s in steps if s not in rows]
            if missing:
                problems.append(f"{name}/{FILE} has no line for steps {missing[:10]}")
    ca = Counter(i for s in steps for i in a.get(s, []))
    cb = Counter(i for s in steps for i in b.get(s, []))
    only_a, only_b = ca - cb, cb - ca
    if only_a or only_b:
        problems.append(
            f"prompt multisets differ over {len(list(steps))} steps: {sum(only_a.values())} more in {run_a} "
            f"(ids {sorted(only_a.elements())[:20]}), {sum(only_b.values())} more in {run_b} "
            f"(ids {sorted(only_b.elements())[:20]})"
        )
    return problems


def _span(rows: dict[int, list[int]]) -> str:
    return f"{len(rows)} steps ({min(rows)}-{max(rows)})" if rows else "no steps"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m areal.trainer.prompt_log RUN_DIR_A RUN_DIR_B", file=sys.stderr)
        return 2
    problems = compare_prompts(*args)
    for p in problems:
        print(p)
    if not problems:
        print(f"same prompts: {sum(len(v) for v in read_prompts(args[0]).values())} over the same steps")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
