"""Reward shaping and GRPO advantages against values worked out by hand."""

import math

import pytest
import torch

from areal.algo.advantages import broadcast_to_tokens, compute_advantages, group_normalize, scale_rewards


def test_scale_rewards_bias_then_scale_then_clip():
    # (1+1)*2=4; (-30+1)*2=-58 -> -10; (5+1)*2=12 -> 10
    out = scale_rewards(torch.tensor([1.0, -30.0, 5.0]), scaling=2.0, bias=1.0, clip=10.0)
    assert out.tolist() == [4.0, -10.0, 10.0]


def test_group_normalize_population_std():
    # groups [1, 0] -> mean .5, std .5 -> [1, -1]; [0, 0] -> no signal
    adv = group_normalize(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2, eps=0.0)
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]


def test_group_normalize_eps_and_mean_only():
    adv = group_normalize(torch.tensor([3.0, 1.0]), 2, eps=1.0)  # (3-2)/(1+1)
    assert adv.tolist() == [0.5, -0.5]
    adv = group_normalize(torch.tensor([3.0, 1.0, 4.0, 4.0]), 2, std=False)
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]


def test_batch_normalize():
    # mean .25, population std sqrt(.25 * .75) = .4330
    adv = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), mode="batch", group_size=2, std=True, eps=0.0)
    s = math.sqrt(0.25 * 0.75)
    assert torch.allclose(adv, torch.tensor([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s]))
    assert compute_advantages(torch.tensor([2.0, 1.0]), mode="none", group_size=2).tolist() == [2.0, 1.0]


def test_group_size_must_divide():
    with pytest.raises(ValueError, match="n_samples"):
        group_normalize(torch.zeros(5), 2)


def test_broadcast_to_tokens():
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]])
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert out.tolist() == [[0.0, 2.0, 2.0], [0.0, 0.0, -1.0]]


def test_overlong_penalty_falls_linearly_in_the_buffer():
    from areal.algo.advantages import overlong_penalty

    # budget 10, buffer 4: free up to 6 tokens, then -0.5 at 8, -1 at 10 and beyond; factor 2 doubles it
    lengths = torch.tensor([5, 6, 8, 10, 12])
    assert overlong_penalty(lengths, max_len=10, buffer_len=4.0).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty(lengths, max_len=10, buffer_len=4.0, factor=2.0).tolist() == [0.0, 0.0, -1.0, -2.0, -2.0]
    with pytest.raises(ValueError, match="actor.overlong_buffer_frac"):
        overlong_penalty(lengths, max_len=10, buffer_len=0.0)
