"""Proximal logprobs interpolated from the behaviour and the current ones (areal.algo.proximal)."""

import pytest
import torch

from areal.algo.proximal import approximate_proximal, interpolation_weight


def test_first_minibatch_takes_the_current_logprobs_everywhere():
    versions = torch.tensor([[-1, 3, 2, 0]])
    assert interpolation_weight(versions, 3, 0.0).tolist() == [[1.0] * 4]


def test_weight_grows_with_a_tokens_lag_and_shrinks_as_the_step_moves_on():
    versions = torch.tensor([[3, 2, 1, 0]])  # lags 0..3 behind version 3
    quarter = interpolation_weight(versions, 3, 0.25)
    assert torch.allclose(quarter, torch.tensor([[0.0, 1 / 1.25, 2 / 2.25, 3 / 3.25]]))
    late = interpolation_weight(versions, 3, 0.75)
    assert (late[0, 1:] < quarter[0, 1:]).all() and late[0, 0] == 0.0
    assert interpolation_weight(torch.tensor([[4]]), 3, 0.5).item() == 0.0  # never ahead of the trainer
    with pytest.raises(ValueError, match="progress"):
        interpolation_weight(versions, 3, 1.0)


def test_exact_when_log_probability_moves_linearly_with_the_version():
    # log p(version) = -2 + 0.1 version: behaviour at 1, proximal at 3, current at 3.5
    line = lambda v: torch.tensor([[-2.0 + 0.1 * v]])  # noqa: E731
    alpha = interpolation_weight(torch.tensor([[1]]), 3, 0.5)
    approx = approximate_proximal(line(1), line(3.5), alpha)
    assert approx.item() == pytest.approx(line(3).item(), abs=1e-6)


def test_the_current_logprobs_enter_detached():
    current = torch.tensor([[-1.0]], requires_grad=True)
    out = approximate_proximal(torch.tensor([[-2.0]]), current, torch.tensor([[0.5]]))
    assert out.item() == pytest.approx(-1.5) and not out.requires_grad
