"""Rollout-policy correction (TIS / MIS, token and sequence level) and the mismatch metrics,
against values worked out by hand."""

import math

import pytest
import torch

from areal.algo.correction import mismatch_metrics, mismatch_sums, rollout_is_weights

# rho = exp(prox - behav): row 0 per token 0.5, 3, 1.5; row 1 1.2, 1.5 and a padded position whose
# huge log-ratio must count nowhere
RHO = [[0.5, 3.0, 1.5], [1.2, 1.5, math.exp(5.0)]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def logprobs():
    prox = torch.log(torch.tensor(RHO))
    return prox, torch.zeros_like(prox)


def test_token_level_tis_truncates_and_mis_masks_above_the_cap():
    prox, behav = logprobs()
    w, capped = rollout_is_weights(prox, behav, MASK, mode="tis", level="token", cap=2.0)
    assert torch.allclose(w, torch.tensor([[0.5, 2.0, 1.5], [1.2, 1.5, 0.0]]))
    assert capped.tolist() == [[False, True, False], [False, False, False]]
    w, _ = rollout_is_weights(prox, behav, MASK, mode="mis", level="token", cap=2.0)
    assert torch.allclose(w, torch.tensor([[0.5, 0.0, 1.5], [1.2, 1.5, 0.0]]))


def test_sequence_level_weights_are_the_product_over_loss_tokens():
    # row 0: 0.5 * 3 * 1.5 = 2.25 > 2; row 1: 1.2 * 1.5 = 1.8 (the padded position left out)
    prox, behav = logprobs()
    w, capped = rollout_is_weights(prox, behav, MASK, mode="tis", level="sequence", cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 2.0, 2.0], [1.8, 1.8, 0.0]]))
    assert capped.tolist() == [[True, True, True], [False, False, False]]
    w, _ = rollout_is_weights(prox, behav, MASK, mode="mis", level="sequence", cap=2.0)
    assert torch.allclose(w, torch.tensor([[0.0, 0.0, 0.0], [1.8, 1.8, 0.0]]))


def test_weights_carry_no_gradient_and_bad_arguments_name_the_key():
    prox, behav = logprobs()
    prox.requires_grad_()
    w, _ = rollout_is_weights(prox, behav, MASK, mode="tis", level="token", cap=2.0)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="actor.rollout_is"):
        rollout_is_weights(prox, behav, MASK, mode="none", level="token", cap=2.0)
    with pytest.raises(ValueError, match="actor.rollout_is_level"):
        rollout_is_weights(prox, behav, MASK, mode="tis", level="row", cap=2.0)


def test_mismatch_metrics_token_level():
    # k3 per loss token, r - 1 - ln r: 0.19315, 0.90139, 0.09453, 0.01768, 0.09453
    prox, behav = logprobs()
    m = mismatch_metrics(mismatch_sums(prox, behav, MASK, level="token", cap=2.0))
    k3 = [r - 1 - math.log(r) for r in (0.5, 3.0, 1.5, 1.2, 1.5)]
    assert m["mismatch/kl"] == pytest.approx(sum(k3) / 5)
    assert m["mismatch/kl"] == pytest.approx(0.26026, abs=1e-5)
    assert m["mismatch/is_weight_mean"] == pytest.approx(7.7 / 5)
    assert m["mismatch/is_weight_max"] == pytest.approx(3.0)
    assert m["mismatch/is_capped_frac"] == pytest.approx(1 / 5)


def test_mismatch_metrics_sequence_level_and_no_cap():
    prox, behav = logprobs()
    m = mismatch_metrics(mismatch_sums(prox, behav, MASK, level="sequence", cap=2.0))
    assert m["mismatch/is_weight_mean"] == pytest.approx((2.25 + 1.8) / 2)
    assert m["mismatch/is_weight_max"] == pytest.approx(2.25)
    assert m["mismatch/is_capped_frac"] == pytest.approx(0.5)
    assert m["mismatch/kl"] == pytest.approx(0.26026, abs=1e-5)  # always per token
    assert mismatch_metrics(mismatch_sums(prox, behav, MASK, level="token", cap=None))["mismatch/is_capped_frac"] == 0


def test_agreeing_policies_have_no_mismatch_and_empty_batches_no_metrics():
    lp = torch.full((2, 3), -0.7)
    m = mismatch_metrics(mismatch_sums(lp, lp.clone(), MASK, level="token", cap=2.0))
    assert m == {
        "mismatch/kl": 0.0,
        "mismatch/is_weight_mean": 1.0,
        "mismatch/is_weight_max": 1.0,
        "mismatch/is_capped_frac": 0.0,
    }
    assert mismatch_metrics(mismatch_sums(lp, lp, torch.zeros(2, 3), level="sequence", cap=2.0)) == {}


def test_sums_over_ranks_give_the_whole_batch_figures():
    # what the trainer does across data-parallel ranks: add the sums, take the max of maxima
    prox, behav = logprobs()
    whole = mismatch_metrics(mismatch_sums(prox, behav, MASK, level="token", cap=2.0))
    parts = [mismatch_sums(prox[i : i + 1], behav[i : i + 1], MASK[i : i + 1], level="token", cap=2.0) for i in (0, 1)]
    summed = {k: parts[0][k] + parts[1][k] for k in parts[0]}
    summed["weight_max"] = torch.maximum(parts[0]["weight_max"], parts[1]["weight_max"])
    assert mismatch_metrics(summed) == pytest.approx(whole)
