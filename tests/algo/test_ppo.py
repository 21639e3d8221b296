"""PPO, dual clip, decoupled loss, KL estimators and aggregation against hand-computed values."""

import math

import pytest
import torch

from areal.algo.masked import aggregate, aggregation_weight
from areal.algo.ppo import kl_penalty, ppo_actor_loss


def _row(*values):
    return torch.tensor([list(values)], dtype=torch.float32)


def test_clipped_and_dual_clipped_objective():
    # ratios 1.5, 0.5, 5, 0.5 with advantages +1, +1, -1, -1, eps .2, c_clip 3:
    #   A=+1 r=1.5: max(-1.5, -1.2) = -1.2 (clipped)
    #   A=+1 r=0.5: max(-0.5, -0.8) = -0.5
    #   A=-1 r=5:   max(5, 1.2) = 5 -> dual clip bound 3
    #   A=-1 r=0.5: max(0.5, 0.8) = 0.8 (clipped)
    ratios = _row(1.5, 0.5, 5.0, 0.5)
    logp = torch.log(ratios).requires_grad_()
    loss, stats = ppo_actor_loss(logp, torch.zeros_like(logp), _row(1, 1, -1, -1), torch.ones_like(logp),
                                 eps_clip=0.2, c_clip=3.0)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 3 + 0.8) / 4)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    assert stats["dual_clip_frac"].item() == pytest.approx(0.25)
    loss.backward()
    # only the unclipped token has a gradient: d(-A r)/dlogp = -A r / 4 tokens
    assert torch.allclose(logp.grad, _row(0.0, -0.5 / 4, 0.0, 0.0))


def test_without_dual_clip_negative_advantage_is_unbounded():
    loss, _ = ppo_actor_loss(torch.log(_row(5.0)), _row(0.0), _row(-1.0), _row(1.0), eps_clip=0.2)
    assert loss.item() == pytest.approx(5.0)


def test_loss_mask_excludes_tokens():
    loss, _ = ppo_actor_loss(torch.log(_row(1.0, 5.0)), _row(0, 0), _row(2.0, -1.0), _row(1, 0), eps_clip=0.2)
    assert loss.item() == pytest.approx(-2.0)


def test_decoupled_importance_weight_and_cap():
    # ratio 1 (cur == prox); behaviour weights exp(prox - behav) = 0.5 and 2; cap 1.5 drops the
    # second token, whose count stays in the normaliser: (-1 * 0.5 + 0) / 2
    prox = _row(0.0, 0.0)
    behav = torch.log(_row(2.0, 0.5))
    loss, stats = ppo_actor_loss(prox.clone(), prox, _row(1.0, 1.0), _row(1, 1), eps_clip=0.2,
                                 behav_logprobs=behav, behav_imp_weight_cap=1.5)
    assert loss.item() == pytest.approx(-0.25)
    assert stats["behav_capped_frac"].item() == pytest.approx(0.5)
    assert stats["behav_imp_weight"].item() == pytest.approx(0.5)
    loss, _ = ppo_actor_loss(prox.clone(), prox, _row(1.0, 1.0), _row(1, 1), eps_clip=0.2, behav_logprobs=behav)
    assert loss.item() == pytest.approx(-(0.5 + 2.0) / 2)


def test_kl_estimators():
    logp, ref = _row(0.0), torch.log(_row(2.0))
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(-math.log(2))
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(2 - math.log(2) - 1)
    assert kl_penalty(ref, ref, "k3").item() == 0.0


def test_token_and_sequence_aggregation():
    x = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert aggregate(x, mask, "token_mean").item() == pytest.approx(6 / 3)
    assert aggregate(x, mask, "seq_mean").item() == pytest.approx((1.5 + 3) / 2)
    assert aggregation_weight(mask, "token_mean") == 3
    assert aggregation_weight(mask, "seq_mean") == 2


def test_seq_mean_weights_combine_like_the_whole_batch():
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).int()
    for mode in ("token_mean", "seq_mean"):
        parts = [(x[i:i + 2], mask[i:i + 2]) for i in range(0, 6, 2)]
        w = [aggregation_weight(m, mode) for _, m in parts]
        combined = sum(aggregate(a, m, mode) * wi for (a, m), wi in zip(parts, w)) / sum(w)
        assert combined.item() == pytest.approx(aggregate(x, mask, mode).item(), rel=1e-5)
