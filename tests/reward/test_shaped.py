"""The shaped arithmetic reward of the demo task."""

import pytest

from areal.reward.shaped import arith_exact_reward, arith_near_reward, arith_shaped_reward, parse_arith_completion


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("7", 7),
        (" 7\n", 7),
        ("-3", -3),
        ("3+4=7\n#### 7", 7),
        ("#### 12 ", 12),
        ("7 7", None),
        ("seven", None),
        ("", None),
        ("7#", None),
        ("#### 7 and more", None),
    ],
)
def test_well_formed_answers_only(completion, expected):
    assert parse_arith_completion(completion) == expected


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("7", 1.0),
        ("3+4=7\n#### 7", 1.0),
        ("9", 0.4),
        ("5", 0.4),
        ("8", 0.45),
        ("17", 0.0),
        ("100", 0.0),
        ("abc", 0.0),
        ("", 0.0),
    ],
)
def test_shaped_reward_values(completion, reward):
    assert arith_shaped_reward("3+4=", completion, [], [], question="3+4=", solution="7") == pytest.approx(reward)


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("7", 1.0),
        ("#### 7", 1.0),
        ("8", 1 / 3),
        ("6", 1 / 3),
        ("5", 1 / 6),
        ("9", 1 / 6),
        ("4", 0.0),
        ("10", 0.0),
        ("0", 0.0),
        ("seven", 0.0),
        ("", 0.0),
    ],
)
def test_near_reward_credits_only_neighbours(completion, reward):
    assert arith_near_reward("3+4=", completion, [], [], solution="7") == pytest.approx(reward)


def test_exact_reward_and_missing_solution():
    assert arith_exact_reward("3+4=", "7", [], [], solution="7") == 1.0
    assert arith_exact_reward("3+4=", "8", [], [], solution="7") == 0.0
    with pytest.raises(ValueError, match="integer 'solution'"):
        arith_shaped_reward("3+4=", "7", [], [], question="3+4=")
