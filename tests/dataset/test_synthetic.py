"""The synthetic arithmetic demo task: format, determinism, ranges, splits."""

import pytest

from areal.dataset.synthetic import load_synthetic_arith, make_synthetic_arith
from areal.reward.gsm8k import extract_hash_answer


def test_records_have_gsm8k_format_and_correct_sums():
    records = make_synthetic_arith(200, seed=3)
    for r in records:
        a, b = map(int, r["question"].rstrip("=").split("+"))
        assert r["question"] == f"{a}+{b}="
        assert r["solution"] == str(a + b)
        assert r["answer"] == f"{a}+{b}={a + b}\n#### {a + b}"
        assert extract_hash_answer(r["answer"]) == r["solution"]


def test_max_sum_bounds_every_problem_and_all_are_reachable():
    records = make_synthetic_arith(2000, seed=0, max_sum=9)
    sums = {int(r["solution"]) for r in records}
    assert sums == set(range(10))
    assert len({r["question"] for r in records}) == 55  # every pair with a + b <= 9
    wide = make_synthetic_arith(500, seed=0, max_sum=18)
    assert max(int(r["solution"]) for r in wide) > 9
    assert all(int(x) <= 9 for r in wide for x in r["question"].rstrip("=").split("+"))


def test_deterministic_in_seed_and_split():
    assert make_synthetic_arith(50, seed=7) == make_synthetic_arith(50, seed=7)
    assert make_synthetic_arith(50, seed=7) != make_synthetic_arith(50, seed=8)
    train = load_synthetic_arith("train", size=64, seed=1)
    assert train == load_synthetic_arith("train", size=64, seed=1)
    assert train != load_synthetic_arith("test", size=64, seed=1)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="n must be >= 0"):
        make_synthetic_arith(-1)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        load_synthetic_arith("dev")


def test_word_problems_are_gsm8k_shaped_deterministic_and_correct():
    import re

    from areal.dataset.registry import load_dataset_by_name
    from areal.reward.gsm8k import extract_hash_answer

    train = load_dataset_by_name("synthetic_word", "train", size=200, seed=3)
    assert train == load_dataset_by_name("synthetic_word", "train", size=200, seed=3)
    assert train != load_dataset_by_name("synthetic_word", "test", size=200, seed=3)
    for r in train:
        assert extract_hash_answer(r["answer"]) == r["solution"]
        last = r["answer"].splitlines()[-2]  # the final "x op y = z" line checks out
        lhs, rhs = last.split(" = ")
        assert eval(lhs) == int(rhs) == int(r["solution"]) >= 0
        assert re.search(r"How many \w+", r["question"])
    with pytest.raises(ValueError, match="takes no path"):
        load_dataset_by_name("synthetic_word", "train", path="/x")
    # a larger set starts with the smaller one: the one-GPU recipe's 500 held-out problems hold
    # the two-GPU recipe's 200, so their accuracies stay comparable
    test = load_dataset_by_name("synthetic_word", "test", size=500, seed=3)
    assert test[:200] == load_dataset_by_name("synthetic_word", "test", size=200, seed=3)


def test_balanced_gives_every_problem_equally_often():
    from collections import Counter

    once = make_synthetic_arith(55, seed=4, balanced=True)
    assert len({r["question"] for r in once}) == 55  # each allowed problem exactly once
    counts = Counter(r["question"] for r in make_synthetic_arith(130, seed=4, balanced=True))
    assert len(counts) == 55 and set(counts.values()) == {2, 3}  # two full passes and 20 of a third
    assert once != make_synthetic_arith(55, seed=5, balanced=True)  # the order follows the seed
    assert load_synthetic_arith("test", size=55, seed=0, balanced=True) == make_synthetic_arith(
        55, seed=1, balanced=True
    )


def test_uniform_answers_make_every_sum_equally_frequent():
    from collections import Counter

    # 0 is the sum of one pair of 55 and 9 of ten: uniform pairs give 0 about 1/55 of the time.
    drawn = make_synthetic_arith(5000, seed=3, uniform_answers=True)
    sums = Counter(int(r["solution"]) for r in drawn)
    assert set(sums) == set(range(10)) and min(sums.values()) > 400  # 500 expected each, not ~91
    assert all(int(r["question"][0]) + int(r["question"][2]) == int(r["solution"]) for r in drawn)
    nines = Counter(r["question"] for r in drawn if r["solution"] == "9")
    assert len(nines) == 10  # within a sum, every pair is drawn
    # balanced: the sums, and the pairs of each sum, in shuffled passes: exact counts
    exact = make_synthetic_arith(100, seed=3, uniform_answers=True, balanced=True)
    assert set(Counter(r["solution"] for r in exact).values()) == {10}
    assert set(Counter(r["question"] for r in exact if r["solution"] == "9").values()) == {1}
    assert load_synthetic_arith("train", size=50, seed=2, uniform_answers=True) == make_synthetic_arith(
        50, seed=2000, uniform_answers=True
    )


def test_balanced_word_problems_take_every_template_equally_often(monkeypatch):
    from collections import Counter

    from areal.dataset import word_problems

    def template(tag):
        return lambda rng, name, she, item: (f"{tag} How many {item}?", "1 + 0 = 1", 1)

    monkeypatch.setattr(word_problems, "TEMPLATES", [template(t) for t in "abc"])
    counts = Counter(r["question"][0] for r in word_problems.make_word_problems(10, seed=2, balanced=True))
    assert sorted(counts.values()) == [3, 3, 4]  # three full passes and one of a fourth
    drawn = Counter(r["question"][0] for r in word_problems.make_word_problems(300, seed=2))
    assert set(drawn) == set("abc")  # unbalanced: independent draws, all templates reachable
