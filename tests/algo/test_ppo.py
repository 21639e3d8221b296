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
    loss, stats = ppo_actor_loss(
        logp, torch.zeros_like(logp), _row(1, 1, -1, -1), torch.ones_like(logp), eps_clip=0.2, c_clip=3.0
    )
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
    loss, stats = ppo_actor_loss(
        prox.clone(), prox, _row(1.0, 1.0), _row(1, 1), eps_clip=0.2, behav_logprobs=behav, behav_imp_weight_cap=1.5
    )
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
        parts = [(x[i : i + 2], mask[i : i + 2]) for i in range(0, 6, 2)]
        w = [aggregation_weight(m, mode) for _, m in parts]
        combined = sum(aggregate(a, m, mode) * wi for (a, m), wi in zip(parts, w)) / sum(w)
        assert combined.item() == pytest.approx(aggregate(x, mask, mode).item(), rel=1e-5)


def test_clip_higher_clips_each_side_at_its_own_epsilon():
    # ratios 1.25, 1.35, 0.75, 0.85 with advantages +1, +1, -1, -1; clip range [0.8, 1.28]:
    #   A=+1 r=1.25: max(-1.25, -1.25) = -1.25 (inside: the symmetric 0.2 would clip it to -1.2)
    #   A=+1 r=1.35: max(-1.35, -1.28) = -1.28 (clipped above)
    #   A=-1 r=0.75: max(0.75, 0.8) = 0.8 (clipped below)
    #   A=-1 r=0.85: 0.85
    logp = torch.log(_row(1.25, 1.35, 0.75, 0.85)).requires_grad_()
    loss, stats = ppo_actor_loss(
        logp, torch.zeros_like(logp), _row(1, 1, -1, -1), torch.ones_like(logp), eps_clip=0.2, eps_clip_high=0.28
    )
    assert loss.item() == pytest.approx((-1.25 - 1.28 + 0.8 + 0.85) / 4)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    assert stats["clip_high_frac"].item() == pytest.approx(0.25)
    assert stats["clip_low_frac"].item() == pytest.approx(0.25)
    loss.backward()  # the unclipped tokens: d(-A r)/dlogp / 4 = -1.25/4 and +0.85/4
    assert torch.allclose(logp.grad, _row(-1.25 / 4, 0.0, 0.0, 0.85 / 4))
    symmetric, _ = ppo_actor_loss(
        logp.detach(), torch.zeros_like(logp), _row(1, 1, -1, -1), torch.ones_like(logp), eps_clip=0.2
    )
    assert symmetric.item() == pytest.approx((-1.2 - 1.2 + 0.8 + 0.85) / 4)


def test_sequence_ratio_is_the_geometric_mean_on_every_token():
    # token log-ratios ln 2 and 0: the sequence ratio is exp(ln 2 / 2) = sqrt 2 on both tokens
    prox = _row(0.0, 0.0)
    logp = torch.tensor([[math.log(2.0), 0.0]], requires_grad=True)
    loss, stats = ppo_actor_loss(logp, prox, _row(1.0, 1.0), _row(1, 1), eps_clip=0.5, ratio_level="sequence")
    assert loss.item() == pytest.approx(-math.sqrt(2))
    assert stats["importance_ratio"].item() == pytest.approx(math.sqrt(2))
    loss.backward()
    # d(-s)/dlogp_j = -s / 2 for both tokens, although only the first token's ratio moved
    assert torch.allclose(logp.grad, _row(-math.sqrt(2) / 2, -math.sqrt(2) / 2))
    # the token ratios 2 and 1 clip the first token at 1.5: (-1.5 - 1) / 2
    token, _ = ppo_actor_loss(logp.detach(), prox, _row(1.0, 1.0), _row(1, 1), eps_clip=0.5)
    assert token.item() == pytest.approx(-1.25)


def test_sequence_ratio_ignores_tokens_off_the_mask():
    from areal.algo.ppo import sequence_log_ratio

    d = sequence_log_ratio(torch.tensor([[math.log(3.0), 7.0, 0.0]]), torch.zeros(1, 3), _row(1, 0, 0))
    assert torch.allclose(d.exp(), _row(3.0, 3.0, 3.0))


def test_correction_weights_replace_the_decoupled_weight():
    prox = _row(0.0, 0.0)
    loss, _ = ppo_actor_loss(prox.clone(), prox, _row(1.0, 1.0), _row(1, 1), eps_clip=0.2, is_weights=_row(0.5, 2.0))
    assert loss.item() == pytest.approx(-(0.5 + 2.0) / 2)
    with pytest.raises(ValueError, match="not both"):
        ppo_actor_loss(
            prox.clone(), prox, _row(1.0, 1.0), _row(1, 1), eps_clip=0.2, behav_logprobs=prox, is_weights=_row(1.0, 1.0)
        )


def test_k2_estimator():
    logp, ref = _row(0.0), torch.log(_row(2.0))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_penalty(ref, ref, "k2").item() == 0.0
    with pytest.raises(ValueError, match="actor.kl_estimator"):
        kl_penalty(logp, ref, "k4")


def test_seq_mean_token_sum_aggregation():
    x = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # per-sequence sums 3 and 3 (the third has no loss tokens), mean over the two: 3
    assert aggregate(x, mask, "seq_mean_token_sum").item() == pytest.approx(3.0)
    assert aggregation_weight(mask, "seq_mean_token_sum") == 2
    with pytest.raises(ValueError, match="seq_mean_token_sum"):
        aggregate(x, mask, "token_sum")


def test_seq_mean_token_sum_weights_combine_like_the_whole_batch():
    torch.manual_seed(1)
    x = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).int()
    parts = [(x[i : i + 3], mask[i : i + 3]) for i in (0, 3)]
    w = [aggregation_weight(m, "seq_mean_token_sum") for _, m in parts]
    combined = sum(aggregate(a, m, "seq_mean_token_sum") * wi for (a, m), wi in zip(parts, w)) / sum(w)
    assert combined.item() == pytest.approx(aggregate(x, mask, "seq_mean_token_sum").item(), rel=1e-5)


def test_entropy_bonus_value_and_gradient():
    from areal.algo.ppo import entropy_bonus

    logp = torch.log(_row(0.25, 0.5)).requires_grad_()
    entropy = _row(0.6, 0.7)
    bonus = entropy_bonus(logp, entropy)
    assert torch.allclose(bonus, entropy)  # the value is the exact entropy
    bonus.sum().backward()
    # gradient (-log p - H): -ln .25 - .6 and -ln .5 - .7
    assert torch.allclose(logp.grad, _row(math.log(4) - 0.6, math.log(2) - 0.7))


def test_entropy_bonus_gradient_is_the_entropy_gradient_in_expectation():
    # two classes, p = (1/4, 3/4) from logits (0, ln 3): H = 0.5623; dH/dz_i = -p_i (log p_i + H)
    # = (+0.2060, -0.2060). Averaging the surrogate's gradient over y ~ p gives the same.
    from areal.algo.ppo import entropy_bonus

    z = torch.tensor([0.0, math.log(3.0)], requires_grad=True)
    logp = torch.log_softmax(z, -1)
    p = logp.exp().detach()
    h = -(p * logp.detach()).sum()
    assert h.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    expected = sum(p[y] * torch.autograd.grad(entropy_bonus(logp[y], h), z, retain_graph=True)[0] for y in range(2))
    assert torch.allclose(expected, torch.tensor([0.2060, -0.2060]), atol=1e-4)
    exact = torch.autograd.grad(-(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(), z)[0]
    assert torch.allclose(expected, exact, atol=1e-6)
