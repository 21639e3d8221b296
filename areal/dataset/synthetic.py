"""The CPU demo task: small addition problems in GSM8K's record format.

A 2-layer, hidden-128 model with the character tokenizer of `areal.models.tiny` learns these by
RL alone (the CPU demo, configs/tiny_arith_cpu.yaml; its measured accuracy is in
docs/getting-started.md). Records look like GSM8K's, so the same
workflow, reward plumbing and evaluation serve both:

    {"question": "3+4=", "answer": "3+4=7\\n#### 7", "solution": "7"}

Generation is deterministic in (seed, split): the train and test streams come from different
random streams. With small sums there are few distinct problems (55 for max_sum=9), so the
splits share problems; that is fine for a learning demo and is said here so nobody relies on
disjoint problem sets.

    python -m areal.dataset.synthetic 5          # print five problems
"""

from __future__ import annotations

import argparse
import json
import random


def make_synthetic_arith(
    n: int, seed: int = 0, max_sum: int = 9, max_operand: int = 9, balanced: bool = False, uniform_answers: bool = False
) -> list[dict]:
    """`n` problems `a+b=` with 0 <= a, b <= max_operand and a + b <= max_sum, from `seed`.

    Pairs are drawn uniformly among the allowed ones, so every allowed problem is equally likely.
    `balanced` instead walks shuffled passes over all allowed pairs, so every problem appears
    equally often (within one): n = the number of pairs gives each problem once, an exact
    accuracy over the task where independent draws repeat some problems and miss others.

    `uniform_answers` draws the answer (the sum) first, uniformly, then a pair with that sum, so
    every answer is equally frequent. Among uniform pairs the answer 0 has one pair of 55 and
    the answer 9 ten, and a policy trained on them learns that small answers are rarely right.
    With `balanced`, the sums and each sum's pairs both go in shuffled passes.
    """
    if n < 0:
        raise ValueError(f"synthetic arith: n must be >= 0, got {n}")
    if max_sum < 0 or max_operand < 0:
        raise ValueError(f"synthetic arith: max_sum and max_operand must be >= 0, got {max_sum}, {max_operand}")
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1) if a + b <= max_sum]
    rng = random.Random(seed)
    if uniform_answers:
        by_sum: dict[int, list[tuple[int, int]]] = {}
        for pair in pairs:
            by_sum.setdefault(sum(pair), []).append(pair)
        draw_sum = _drawer(list(by_sum), rng, balanced)
        draw_pair = {total: _drawer(group, rng, balanced) for total, group in by_sum.items()}
        return [_record(*draw_pair[draw_sum()]()) for _ in range(n)]
    draw = _drawer(pairs, rng, balanced)
    return [_record(*draw()) for _ in range(n)]


def _drawer(items: list, rng: random.Random, balanced: bool):
    """A function returning the next item: an independent uniform draw, or with `balanced` the
    next of shuffled passes over all items (each appears equally often, within one)."""
    if not balanced:
        return lambda: rng.choice(items)
    queue: list = []

    def next_item():
        if not queue:
            queue.extend(rng.sample(items, len(items)))
        return queue.pop(0)

    return next_item


def _record(a: int, b: int) -> dict:
    """One problem in GSM8K's record format."""
    total = a + b
    question = f"{a}+{b}="
    return {"question": question, "answer": f"{question}{total}\n#### {total}", "solution": str(total)}


def split_seed(seed: int, split: str) -> int:
    """A seed per split, so train and test draw from different streams of the same base seed.

    Derived arithmetically (not with hash(), which Python randomizes per process).
    """
    offsets = {"train": 0, "test": 1, "validation": 2, "eval": 1}
    if split not in offsets:
        raise ValueError(f"synthetic arith: unknown split {split!r}; use one of {sorted(offsets)}")
    return seed * 1000 + offsets[split]


def load_synthetic_arith(
    split: str = "train",
    *,
    size: int = 1024,
    seed: int = 0,
    max_sum: int = 9,
    max_operand: int = 9,
    balanced: bool = False,
    uniform_answers: bool = False,
) -> list[dict]:
    """The registry entry point: `size` problems of `split` (see `load_dataset_by_name`)."""
    return make_synthetic_arith(
        size,
        split_seed(seed, split),
        max_sum=max_sum,
        max_operand=max_operand,
        balanced=balanced,
        uniform_answers=uniform_answers,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print synthetic arithmetic problems.")
    parser.add_argument("n", type=int, nargs="?", default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-sum", type=int, default=9)
    args = parser.parse_args(argv)
    for record in make_synthetic_arith(args.n, args.seed, args.max_sum):
        print(json.dumps(record))


if __name__ == "__main__":
    main()
