"""The assembled actor loss follows the config switches."""

import pytest
import torch

from areal.algo.actor import (
    PROX_ALPHA,
    PROX_FROM_TRAINING,
    loss_weight_fn,
    ppo_loss_fn,
    prepare_ppo_batch,
    proximal_minibatches,
    rows_to_recompute,
    split_minibatches,
)
from areal.config.actor import ActorConfig


def _batch():
    return {
        "input_ids": torch.zeros(4, 3, dtype=torch.long),
        "loss_mask": torch.tensor([[0, 1, 1]] * 4),
        "logprobs": torch.zeros(4, 3),
        "rewards": torch.tensor([1.0, 0.0, 5.0, 5.0]),
    }


def test_prepare_batch_group_advantages_on_tokens():
    cfg = ActorConfig(reward_clip=2.0)
    out = prepare_ppo_batch(_batch(), cfg, group_size=2)
    assert out["rewards"].tolist() == [1.0, 0.0, 2.0, 2.0]
    assert torch.allclose(out["advantages"][:, 1], torch.tensor([1.0, -1.0, 0.0, 0.0]), atol=1e-5)
    assert out["advantages"][:, 0].abs().sum() == 0


def test_loss_fn_needs_prox_when_recomputing():
    cfg = ActorConfig()
    batch = prepare_ppo_batch(_batch(), cfg, group_size=2)
    with pytest.raises(KeyError, match="prox_logprobs"):
        ppo_loss_fn(cfg)(torch.zeros(4, 3), torch.zeros(4, 3), batch)
    batch["prox_logprobs"] = torch.zeros(4, 3)
    loss, stats = ppo_loss_fn(cfg)(torch.zeros(4, 3), torch.zeros(4, 3), batch)
    # ratio 1, weight 1: loss = -mean advantage over tokens = -(1 - 1 + 0 + 0) / 4
    assert loss.item() == pytest.approx(0.0, abs=1e-5)
    assert loss_weight_fn(cfg)(batch) == 8


def test_kl_term_added():
    cfg = ActorConfig(kl_ctl=0.5, use_decoupled_loss=False, recompute_logprob=False, adv_norm="none")
    batch = _batch()
    batch["rewards"] = torch.zeros(4)
    batch = prepare_ppo_batch(batch, cfg, group_size=2)
    batch["ref_logprobs"] = torch.full((4, 3), -1.0)
    loss, stats = ppo_loss_fn(cfg)(torch.zeros(4, 3), torch.zeros(4, 3), batch)
    k3 = torch.exp(torch.tensor(-1.0)) + 1 - 1  # exp(d) - d - 1 with d = -1
    assert loss.item() == pytest.approx(0.5 * k3.item(), rel=1e-5)


def test_split_minibatches():
    parts = split_minibatches(_batch(), 2)
    assert [p["rewards"].tolist() for p in parts] == [[1.0, 0.0], [5.0, 5.0]]
    with pytest.raises(ValueError, match="ppo_n_minibatches"):
        split_minibatches(_batch(), 3)


def test_recompute_covers_all_rows_or_all_but_the_first_minibatchs():
    batch = _batch()
    assert rows_to_recompute(batch, ActorConfig(ppo_n_minibatches=2))["rewards"].tolist() == [1.0, 0.0, 5.0, 5.0]
    cfg = ActorConfig(ppo_n_minibatches=2, recompute_first_minibatch=False)
    tail = rows_to_recompute(batch, cfg)
    assert tail["rewards"].tolist() == [5.0, 5.0]
    assert rows_to_recompute(batch, ActorConfig(ppo_n_minibatches=1, recompute_first_minibatch=False)) is None

    tail["prox_logprobs"] = torch.full((2, 3), -0.5)
    first, second = proximal_minibatches(batch, tail, cfg)
    assert first[PROX_FROM_TRAINING] and PROX_FROM_TRAINING not in second
    assert second["prox_logprobs"].tolist() == [[-0.5] * 3] * 2 and second["rewards"].tolist() == [5.0, 5.0]
    (only,) = proximal_minibatches(batch, None, ActorConfig(ppo_n_minibatches=1, recompute_first_minibatch=False))
    assert only[PROX_FROM_TRAINING] and "prox_logprobs" not in only


def test_a_minibatch_marked_prox_from_training_clips_against_its_own_logprobs():
    cfg = ActorConfig(recompute_first_minibatch=False)
    batch = prepare_ppo_batch(_batch(), cfg, group_size=2)
    logprobs = torch.full((4, 3), -1.0, requires_grad=True)
    own, own_stats = ppo_loss_fn(cfg)(logprobs, torch.zeros(4, 3), {**batch, PROX_FROM_TRAINING: True})
    given, given_stats = ppo_loss_fn(cfg)(logprobs, torch.zeros(4, 3), {**batch, "prox_logprobs": logprobs.detach()})
    assert own.item() == given.item() and own_stats["importance_ratio"] == 1.0
    own.backward()
    assert logprobs.grad is not None and logprobs.grad.abs().sum() > 0  # the gradient flows through logprobs only


def test_overlong_penalty_shapes_rewards_before_scaling():
    # budget 4 tokens, buffer 0.5 x 4 = 2: answers of 2 loss tokens are free, 3 get -0.5, 4 get -1
    cfg = ActorConfig(overlong_buffer_frac=0.5, reward_scaling=2.0, adv_norm="none")
    batch = {
        "loss_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]),
        "rewards": torch.tensor([1.0, 1.0, 1.0, 0.0]),
    }
    out = prepare_ppo_batch(batch, cfg, group_size=2, max_new_tokens=4)
    assert out["overlong_penalty"].tolist() == [0.0, -0.5, -1.0, 0.0]
    assert out["rewards"].tolist() == [2.0, 1.0, 0.0, 0.0]  # (r + penalty) * 2
    with pytest.raises(ValueError, match="max_new_tokens"):
        prepare_ppo_batch(batch, cfg, group_size=2)
    assert "overlong_penalty" not in prepare_ppo_batch(batch, ActorConfig(), group_size=2)


def _loss_batch(prox, behav, adv):
    return {
        "loss_mask": torch.ones_like(prox, dtype=torch.long),
        "logprobs": behav,
        "prox_logprobs": prox,
        "advantages": adv,
    }


def test_rollout_correction_replaces_the_decoupled_weight():
    # cur == prox (ratio 1), advantages 1, rho = 0.5 and 3 per token
    prox = torch.zeros(1, 2)
    behav = torch.log(torch.tensor([[2.0, 1 / 3]]))
    mb = _loss_batch(prox, behav, torch.ones(1, 2))
    raw, _ = ppo_loss_fn(ActorConfig())(prox.clone(), torch.zeros(1, 2), mb)
    assert raw.item() == pytest.approx(-(0.5 + 3.0) / 2)  # the decoupled loss, uncapped
    tis, _ = ppo_loss_fn(ActorConfig(rollout_is="tis", rollout_is_cap=2.0))(prox.clone(), torch.zeros(1, 2), mb)
    assert tis.item() == pytest.approx(-(0.5 + 2.0) / 2)
    mis, _ = ppo_loss_fn(ActorConfig(rollout_is="mis", rollout_is_cap=2.0))(prox.clone(), torch.zeros(1, 2), mb)
    assert mis.item() == pytest.approx(-(0.5 + 0.0) / 2)
    # sequence level: rho = 1.5 for both tokens, under the cap
    seq_loss = ppo_loss_fn(ActorConfig(rollout_is="tis", rollout_is_level="sequence"))
    seq, _ = seq_loss(prox.clone(), torch.zeros(1, 2), mb)
    assert seq.item() == pytest.approx(-1.5)
    # the same weights without the decoupled loss: the correction supplies the weight either way
    plain, _ = ppo_loss_fn(ActorConfig(rollout_is="tis", use_decoupled_loss=False))(prox.clone(), torch.zeros(1, 2), mb)
    assert plain.item() == pytest.approx(tis.item())
    with pytest.raises(ValueError, match="recompute_logprob"):
        ppo_loss_fn(ActorConfig(rollout_is="tis", use_decoupled_loss=False, recompute_logprob=False))


def test_clip_bounds_follow_eps_clip_and_reach_the_loss():
    from areal.algo.actor import clip_bounds

    assert clip_bounds(ActorConfig(eps_clip=0.3)) == (0.3, 0.3)
    assert clip_bounds(ActorConfig(eps_clip=0.3, eps_clip_high=0.5)) == (0.3, 0.5)
    # ratio 1.4 with advantage 1: clipped at 1.28 under clip-higher, at 1.2 symmetric
    cur = torch.log(torch.tensor([[1.4]]))
    mb = _loss_batch(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))
    loss, _ = ppo_loss_fn(ActorConfig(eps_clip_high=0.28))(cur, torch.zeros(1, 1), mb)
    assert loss.item() == pytest.approx(-1.28)
    loss, _ = ppo_loss_fn(ActorConfig())(cur, torch.zeros(1, 1), mb)
    assert loss.item() == pytest.approx(-1.2)


def test_entropy_bonus_is_subtracted_and_entropy_logged():
    cur = torch.log(torch.tensor([[0.5, 0.25]]))
    mb = _loss_batch(cur.clone(), cur.clone(), torch.zeros(1, 2))  # advantage 0: no policy gradient
    entropy = torch.tensor([[0.6, 1.0]])
    loss, stats = ppo_loss_fn(ActorConfig(entropy_coeff=0.1))(cur, entropy, mb)
    assert loss.item() == pytest.approx(-0.1 * 0.8)
    assert stats["entropy"].item() == pytest.approx(0.8)
    loss, stats = ppo_loss_fn(ActorConfig())(cur, entropy, mb)
    assert loss.item() == pytest.approx(0.0) and stats["entropy"].item() == pytest.approx(0.8)


def test_kl_estimator_follows_the_config():
    cfg = ActorConfig(kl_ctl=1.0, kl_estimator="k2", use_decoupled_loss=False, recompute_logprob=False)
    mb = _loss_batch(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1))
    mb["ref_logprobs"] = torch.full((1, 1), -1.0)
    loss, stats = ppo_loss_fn(cfg)(torch.zeros(1, 1), torch.zeros(1, 1), mb)
    assert loss.item() == pytest.approx(0.5) and stats["kl_ref"].item() == pytest.approx(0.5)  # (0 - -1)^2 / 2


def test_mismatch_sums_use_the_cap_in_force():
    from areal.algo.actor import rollout_mismatch_sums

    mb = _loss_batch(torch.zeros(1, 2), torch.log(torch.tensor([[2.0, 1 / 3]])), torch.ones(1, 2))  # rho .5, 3
    assert float(rollout_mismatch_sums(mb, ActorConfig())["capped"]) == 0  # decoupled, no cap
    assert float(rollout_mismatch_sums(mb, ActorConfig(behav_imp_weight_cap=2.5))["capped"]) == 1
    assert float(rollout_mismatch_sums(mb, ActorConfig(rollout_is="mis", rollout_is_cap=4.0))["capped"]) == 0
    seq = rollout_mismatch_sums(mb, ActorConfig(rollout_is="mis", rollout_is_level="sequence"))
    assert float(seq["units"]) == 1 and float(seq["weight_max"]) == pytest.approx(1.5)


def test_entropy_bonus_from_sampled_tokens_follows_the_exact_entropy_gradient():
    # a two-token policy p = (1/4, 3/4) from logits (0, ln 3), 20000 tokens sampled from it, zero
    # advantages: the loss's gradient is -grad H = -(0.2060, -0.2060) up to sampling noise
    # (standard error about 0.002)
    import math

    torch.manual_seed(0)
    z = torch.tensor([0.0, math.log(3.0)], requires_grad=True)
    logp_all = torch.log_softmax(z, -1)
    n = 20000
    tokens = torch.multinomial(logp_all.exp().detach(), n, replacement=True)
    logprobs = logp_all[tokens][None]
    entropy = (-(logp_all.exp() * logp_all).sum()).detach().expand(1, n)
    mb = _loss_batch(logprobs.detach(), logprobs.detach(), torch.zeros(1, n))
    loss, _ = ppo_loss_fn(ActorConfig(entropy_coeff=1.0))(logprobs, entropy, mb)
    loss.backward()
    assert torch.allclose(z.grad, torch.tensor([-0.2060, 0.2060]), atol=0.01)


def test_loglinear_minibatches_carry_interpolation_weights_and_skip_the_recompute():
    cfg = ActorConfig(ppo_n_minibatches=2, prox_logp_method="loglinear")
    batch = {**_batch(), "versions": torch.tensor([[-1, 5, 5], [-1, 4, 4], [-1, 5, 3], [-1, 4, 5]])}
    assert rows_to_recompute(batch, cfg) is None
    first, second = proximal_minibatches(batch, None, cfg, version=5)
    assert first[PROX_ALPHA].tolist() == [[1.0] * 3] * 2  # minibatch 0 trains at the proximal weights
    # minibatch 1 of 2: the current weights stand half a version past 5; lags 2 and 1 -> 2/2.5, 1/1.5
    assert torch.allclose(second[PROX_ALPHA][:, 1:], torch.tensor([[0.0, 0.8], [2 / 3, 0.0]]))
    assert "prox_logprobs" not in second and PROX_FROM_TRAINING not in first
    with pytest.raises(ValueError, match="weight version"):
        proximal_minibatches(batch, None, cfg)
    with pytest.raises(KeyError, match="versions"):
        proximal_minibatches(_batch(), None, cfg, version=5)


def test_loglinear_loss_interpolates_between_behaviour_and_detached_current_logprobs():
    cfg = ActorConfig(prox_logp_method="loglinear", use_decoupled_loss=False)
    batch = prepare_ppo_batch(_batch(), cfg, group_size=2)
    batch["logprobs"] = torch.full((4, 3), -2.0)
    batch[PROX_ALPHA] = torch.full((4, 3), 0.25)
    logprobs = torch.full((4, 3), -1.0, requires_grad=True)
    loss, stats = ppo_loss_fn(cfg)(logprobs, torch.zeros(4, 3), batch)
    prox = torch.full((4, 3), -2.0 + 0.25 * 1.0)  # behav + alpha (cur - behav)
    given, given_stats = ppo_loss_fn(ActorConfig(use_decoupled_loss=False))(
        logprobs, torch.zeros(4, 3), {**batch, "prox_logprobs": prox}
    )
    assert loss.item() == pytest.approx(given.item()) and stats["prox_alpha"] == 0.25
    assert stats["importance_ratio"] == pytest.approx(torch.exp(torch.tensor(0.75)).item())
    loss.backward()
    assert logprobs.grad.abs().sum() > 0


def test_metrics_mode_trains_on_the_recompute_and_reports_loglinears_error():
    cfg = ActorConfig(prox_logp_method="metrics")
    batch = prepare_ppo_batch(_batch(), cfg, group_size=2)
    batch["logprobs"] = torch.full((4, 3), -2.0)
    batch["prox_logprobs"] = torch.full((4, 3), -1.5)
    batch[PROX_ALPHA] = torch.full((4, 3), 0.5)
    loss, stats = ppo_loss_fn(cfg)(torch.full((4, 3), -1.0), torch.zeros(4, 3), batch)
    given, _ = ppo_loss_fn(ActorConfig())(torch.full((4, 3), -1.0), torch.zeros(4, 3), batch)
    assert loss.item() == pytest.approx(given.item())
    assert stats["prox_approx_abs_err"] == pytest.approx(0.0)  # -2 + 0.5 x 1 = -1.5, the recomputed value
    assert stats["prox_behav_abs_err"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="recompute_logprob=true"):
        ppo_loss_fn(ActorConfig(prox_logp_method="loglinear", recompute_logprob=False, use_decoupled_loss=False))
