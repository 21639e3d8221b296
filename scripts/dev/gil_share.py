"""Samples per thread, and the top stacks, of py-spy raw profiles (scripts/dev/profile_trainer_gil.sh).

    python scripts/dev/gil_share.py OUT/gil_1_123.txt [more.txt ...] [--top 15]

With --gil every sample is a moment some thread held the GIL, so each thread's share of the
samples is its share of the GIL over the window.
"""

from __future__ import annotations

import argparse
import collections
import json


def read_raw(path: str) -> list[tuple[list[str], int]]:
    rows = []
    for line in open(path):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            raise ValueError(f"{path}: not a py-spy raw profile line (STACK COUNT): {line[:200]!r}")
        rows.append((stack.split(";"), int(count)))
    return rows


def thread_name(frame0: str) -> str:
    # "thread (12046): rollout-executor" -> "rollout-executor"; unnamed threads keep the id
    return frame0.split(": ", 1)[1] if ": " in frame0 else frame0


def summarise(path: str, top: int) -> dict:
    rows = read_raw(path)
    total = sum(c for _, c in rows)
    by_thread, by_leaf = collections.Counter(), collections.Counter()
    for frames, count in rows:
        name = thread_name(frames[0])
        by_thread[name] += count
        by_leaf[f"{name} | {' <- '.join(reversed(frames[-3:]))}"] += count
    return {
        "file": path,
        "samples": total,
        "share_by_thread": {k: round(v / total, 3) for k, v in by_thread.most_common()} if total else {},
        "top_stacks": [[round(v / total, 3), k] for k, v in by_leaf.most_common(top)] if total else [],
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    print(json.dumps([summarise(f, args.top) for f in args.files], indent=1))


if __name__ == "__main__":
    main()
