"""Answer extraction and the GSM8K reward, checked on the real GSM8K test answers."""

import re
import sys

import pytest

from areal.reward.gsm8k import extract_answer, gsm8k_reward, numbers_equal, reference_solution
from tests.dataset.gsm8k_data import gsm8k_dir


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 18.", "18"),
        ("so she makes $18 a day", "18"),
        ("#### 1,234", "1234"),
        ("total: 109,200,000 dollars", "109200000"),
        ("x = 3 and then \\boxed{42} and 7 more words", "42"),
        ("\\boxed{\\frac{3}{4}}", "3/4"),
        ("\\boxed{1,000}", "1000"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{x = 0.50}", "0.5"),
        ("\\boxed{\\sqrt{4}}", None),  # an expression, not the number 4
        ("\\boxed{2^2}", None),
        ("she lost -5 points", "-5"),
        ("she owes -$5", "-5"),
        ("5-3", "3"),  # a binary minus is not a sign
        ("it weighs 2.50 kg", "2.5"),
        ("18.00", "18"),
        ("3/4 of a cup", "3/4"),
        ("#### 72\nthen 5 more", "72"),  # #### wins over later numbers
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_numbers_equal_is_exact_and_rational():
    assert numbers_equal("0.75", "3/4")
    assert numbers_equal("18", "18.0")
    assert not numbers_equal("18", "18.01")
    assert not numbers_equal("x", "18")


@pytest.fixture(scope="module")
def gsm8k_test():
    from areal.dataset.gsm8k import load_gsm8k

    return load_gsm8k(str(gsm8k_dir()), "test")


def test_every_reference_answer_scores_one(gsm8k_test):
    scores = [gsm8k_reward(r["question"], r["answer"], [], [], **r) for r in gsm8k_test]
    assert scores == [1.0] * len(gsm8k_test)


def test_perturbed_reference_answers_score_zero(gsm8k_test):
    for r in gsm8k_test:
        wrong = str(int(r["solution"]) + 1)
        completion = re.sub(r"####.*$", f"#### {wrong}", r["answer"])
        assert gsm8k_reward(r["question"], completion, [], [], **r) == 0.0, completion


def test_other_answer_formats_score_one(gsm8k_test):
    for r in gsm8k_test[:200]:
        value = int(r["solution"])
        for completion in (
            f"So the answer is \\boxed{{{value}}}.",
            f"The answer is ${value:,}.",
            f"... which gives {value}.00",
        ):
            assert gsm8k_reward("", completion, [], [], **r) == 1.0, completion


def test_reference_from_answer_when_no_solution_field():
    assert reference_solution({"answer": "work\n#### 2,000"}) == "2000"
    assert gsm8k_reward("", "it is 2000", [], [], answer="#### 2,000") == 1.0
    assert gsm8k_reward("", "I do not know", [], [], answer="#### 5") == 0.0
    with pytest.raises(ValueError, match="'solution' field or an 'answer'"):
        gsm8k_reward("", "5", [], [], question="q")


def test_builtin_comparison_covers_fractions_without_math_verify(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # as if not installed
    assert gsm8k_reward("", "\\boxed{\\frac{1}{2}}", [], [], solution="0.5") == 1.0
    assert gsm8k_reward("", "\\boxed{\\sqrt{4}}", [], [], solution="2") == 0.0  # undecidable: no
    assert gsm8k_reward("", "\\boxed{\\sqrt{4}}", [], [], solution="4") == 0.0


def test_math_verify_judges_latex_expressions_when_installed():
    pytest.importorskip("math_verify")
    assert gsm8k_reward("", "\\boxed{\\sqrt{4}}", [], [], solution="2") == 1.0
    assert gsm8k_reward("", "\\boxed{2^2}", [], [], solution="4") == 1.0
    assert gsm8k_reward("", "\\boxed{0.6}", [], [], solution="1/2") == 0.0
