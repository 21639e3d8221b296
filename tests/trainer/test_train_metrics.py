"""train/* of a step from its PPO minibatches: totals, token-weighted means, and the last one's rest."""

import pytest

from areal.trainer.grpo import train_metrics


def test_minibatch_figures_become_the_steps():
    stats = [
        {"loss": 1.0, "grad_norm": 2.0, "lr": 1e-5, "skipped": 0.0, "n_microbatches": 2.0, "n_tokens": 300.0,
         "mb_token_budget": 4096.0, "loss_fn/entropy": 0.5, "loss_fn/clip_low_frac": 0.1},
        {"loss": 3.0, "grad_norm": 6.0, "lr": 2e-5, "skipped": 1.0, "n_microbatches": 1.0, "n_tokens": 100.0,
         "mb_token_budget": 8192.0, "loss_fn/entropy": 0.9},
    ]  # fmt: skip
    got = train_metrics(stats)
    assert got["train/n_tokens"] == 400.0 and got["train/n_microbatches"] == 3.0 and got["train/skipped"] == 1.0
    assert got["train/loss"] == pytest.approx((1.0 * 300 + 3.0 * 100) / 400)  # weighted by tokens
    assert got["train/grad_norm"] == pytest.approx(3.0) and got["train/grad_norm_max"] == 6.0
    assert got["train/loss_fn/entropy"] == pytest.approx((0.5 * 300 + 0.9 * 100) / 400)
    assert got["train/loss_fn/clip_low_frac"] == pytest.approx(0.1)  # only the minibatch that has it
    assert got["train/lr"] == 2e-5 and got["train/mb_token_budget"] == 8192.0  # where the step ends


def test_a_step_without_token_counts_weighs_its_minibatches_alike():
    got = train_metrics([{"loss": 1.0, "grad_norm": 1.0}, {"loss": 2.0, "grad_norm": 3.0}])
    assert got["train/loss"] == 1.5 and got["train/grad_norm"] == 2.0 and got["train/n_tokens"] == 0.0
