"""Easy GSM8K-style word problems, generated: one or two steps of small-number arithmetic.

The shortest GSM8K questions still need several steps that a 135M model rarely gets right
(SmolLM2-135M-Instruct scored 0 of 16 of them greedily here), which leaves GRPO no reward to
follow. These problems keep GSM8K's wording and record format but stay at the level where such
a model is sometimes right, so RL has a signal and the held-out accuracy can be seen to move:

    {"question": "Mia has 7 apples. She buys 5 more. How many apples does Mia have now?",
     "answer": "7 + 5 = 12\\n#### 12", "solution": "12"}

Deterministic in (seed, split); train and test come from different random streams.

    python -m areal.dataset.word_problems 5          # print five problems
"""

from __future__ import annotations

import argparse
import json
import random

from areal.dataset.synthetic import split_seed

NAMES = [("Mia", "She"), ("Tom", "He"), ("Ava", "She"), ("Sam", "He"), ("Lily", "She"), ("Ben", "He")]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells"]


def _one_step(question: str, a: int, op: str, b: int) -> tuple[str, str, int]:
    """A problem solved by one operation: the question, its worked line and the answer."""
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return question, f"{a} {op} {b} = {value}", value


def _add(rng, name, she, item):
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    return _one_step(f"{name} has {a} {item}. {she} buys {b} more. How many {item} does {name} have now?", a, "+", b)


def _sub(rng, name, she, item):
    a = rng.randint(5, 30)
    b = rng.randint(1, a - 1)
    return _one_step(
        f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?", a, "-", b
    )


def _total(rng, name, she, item):
    a, b = rng.randint(2, 25), rng.randint(2, 25)
    return _one_step(
        f"There are {a} {item} in a box and {b} {item} in a bag. How many {item} are there in total?", a, "+", b
    )


def _times(rng, name, she, item):
    a, b = rng.randint(2, 6), rng.randint(2, 6)
    return _one_step(
        f"{name} buys {a} packs of {item}. Each pack has {b} {item}. How many {item} does {name} buy?", a, "*", b
    )


def _two_steps(rng, name, she, item):
    a, b = rng.randint(3, 15), rng.randint(2, 10)
    c = rng.randint(1, a + b - 1)
    return (
        f"{name} has {a} {item}. {she} gets {b} more and then gives away {c}. How many {item} does {name} have?",
        f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}",
        a + b - c,
    )


TEMPLATES = [_add, _sub, _total, _times, _two_steps]


def make_word_problems(n: int, seed: int = 0, balanced: bool = False) -> list[dict]:
    """`n` problems in GSM8K's record format, drawn from `seed`; `balanced` takes the templates in
    shuffled passes, so every kind of problem appears equally often (within one)."""
    if n < 0:
        raise ValueError(f"word problems: n must be >= 0, got {n}")
    rng = random.Random(seed)
    templates: list = []
    out = []
    for _ in range(n):
        name, she = rng.choice(NAMES)
        if balanced:
            templates = templates or rng.sample(TEMPLATES, len(TEMPLATES))
            template = templates.pop()
        else:
            template = rng.choice(TEMPLATES)
        question, work, value = template(rng, name, she, rng.choice(ITEMS))
        out.append({"question": question, "answer": f"{work}\n#### {value}", "solution": str(value)})
    return out


def load_word_problems(split: str = "train", *, size: int = 1024, seed: int = 0, balanced: bool = False) -> list[dict]:
    """The registry entry point (dataset type `synthetic_word`)."""
    return make_word_problems(size, split_seed(seed, split), balanced=balanced)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print generated word problems.")
    parser.add_argument("n", type=int, nargs="?", default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for record in make_word_problems(args.n, args.seed):
        print(json.dumps(record))


if __name__ == "__main__":
    main()
