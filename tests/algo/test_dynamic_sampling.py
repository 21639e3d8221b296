"""Dynamic sampling's zero-variance test and its per-step metrics."""

import pytest
import torch

from areal.algo.dynamic_sampling import filter_metrics, has_reward_variance, zero_variance_groups


def test_zero_variance_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5000001])
    assert zero_variance_groups(rewards, 2).tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="n_samples"):
        zero_variance_groups(rewards, 3)


def test_should_accept_keeps_groups_whose_rewards_differ():
    assert has_reward_variance({"rewards": torch.tensor([0.0, 1.0, 1.0])})
    assert not has_reward_variance({"rewards": torch.tensor([0.25, 0.25, 0.25])})
    assert not has_reward_variance({"rewards": torch.tensor([1.0])})  # one answer: nothing to compare


def test_filter_metrics():
    # 32 groups in the batch, 8 dropped on the way (of 8 samples each), 2 kept past the bound
    m = filter_metrics({"groups": 32, "dropped_groups": 8, "dropped_samples": 64, "kept_past_limit": 2})
    assert m == {"rollout/dropped_groups_frac": 0.2, "rollout/extra_samples": 64.0, "rollout/kept_past_limit": 2.0}
    assert filter_metrics({}) == {}
