"""rollout/staleness_* metrics from a batch's per-token weight versions."""

import torch

from areal.trainer.grpo import _staleness


def test_lag_and_samples_that_lived_through_an_update():
    # prompt tokens are -1 and not generated; padding too. The trainer has just trained version 3.
    versions = torch.tensor(
        [
            [-1, -1, 3, 3, 3, -1],  # fresh
            [-1, 1, 1, 2, 2, -1],  # started at 1, the update to 2 came mid-answer
            [-1, -1, 2, 2, -1, -1],
        ]
    )  # one version behind
    generated = versions >= 0
    out = _staleness(versions, generated, trained_version=3)
    assert out["rollout/staleness_max"] == 2
    lags = [0, 0, 0, 2, 2, 1, 1, 1, 1]
    assert abs(out["rollout/staleness_mean"] - sum(lags) / len(lags)) < 1e-6
    assert abs(out["rollout/mixed_version_frac"] - 1 / 3) < 1e-6


def test_no_generated_tokens_gives_no_staleness():
    versions = torch.full((2, 3), -1)
    assert _staleness(versions, versions >= 0, trained_version=0) == {}


def test_rows_without_generated_tokens_do_not_count():
    versions = torch.tensor([[-1, -1], [-1, 4]])
    out = _staleness(versions, versions >= 0, trained_version=4)
    assert out["rollout/mixed_version_frac"] == 0.0 and out["rollout/staleness_max"] == 0
