"""The assembled actor loss follows the config switches."""

import pytest
import torch

from areal.algo.actor import loss_weight_fn, ppo_loss_fn, prepare_ppo_batch, split_minibatches
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
