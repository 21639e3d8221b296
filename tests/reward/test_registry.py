"""resolve_reward_fn: built-in names and import paths, with errors that name the spec."""

import pytest

from areal.reward import resolve_reward_fn
from areal.reward.gsm8k import gsm8k_reward
from areal.reward.shaped import arith_shaped_reward
from tests.reward.slow_rewards import length_reward


def test_builtin_names_and_import_paths():
    assert resolve_reward_fn("gsm8k") is gsm8k_reward
    assert resolve_reward_fn("arith_shaped") is arith_shaped_reward
    assert resolve_reward_fn("tests.reward.slow_rewards:length_reward") is length_reward


@pytest.mark.parametrize(
    "spec, error, pattern",
    [
        ("gsm9k", ValueError, "unknown reward 'gsm9k'.*arith_shaped.*package.module:function"),
        ("no_such_pkg.rewards:fn", ImportError, "'no_such_pkg.rewards:fn'.*cannot import module"),
        ("tests.reward.slow_rewards:nope", ImportError, "has no attribute 'nope'"),
        ("areal.reward.registry:BUILTIN_REWARDS", TypeError, "not callable"),
        ("mod:", ValueError, "not an import path"),
    ],
)
def test_bad_specs(spec, error, pattern):
    with pytest.raises(error, match=pattern):
        resolve_reward_fn(spec)
