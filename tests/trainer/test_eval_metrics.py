"""eval/accuracy_se: the spread of one evaluation's pass rate from the draw of its problems."""

import random
import statistics

import pytest

from areal.utils.stats_logger import accuracy_standard_error


def test_standard_error_matches_the_spread_of_repeated_evaluations():
    rng = random.Random(0)
    true_accuracy, n_problems = 0.75, 200
    rates = [sum(rng.random() < true_accuracy for _ in range(n_problems)) / n_problems for _ in range(4000)]
    assert statistics.stdev(rates) == pytest.approx(accuracy_standard_error(true_accuracy, n_problems), rel=0.05)


def test_standard_error_shrinks_with_the_problems_and_vanishes_at_the_ends():
    assert accuracy_standard_error(0.75, 200) == pytest.approx(0.0306, abs=1e-4)
    assert accuracy_standard_error(0.75, 500) == pytest.approx(0.0194, abs=1e-4)
    assert accuracy_standard_error(0.0, 200) == 0.0 and accuracy_standard_error(1.0, 200) == 0.0
    assert accuracy_standard_error(0.5, 0) == 0.0  # no problems: nothing measured, no error to state
