"""The PPO/GRPO actor objective assembled from the pure pieces, for the training loop.

The loop calls, per step:
    batch = prepare_ppo_batch(batch, actor_cfg, group_size=n_samples)   # rewards -> advantages
    batch["prox_logprobs"] = engine.forward(batch)                      # if actor.recompute_logprob
    batch["ref_logprobs"] = ref_engine.forward(batch)                   # if actor.kl_ctl > 0
    for mb in split_minibatches(batch, actor_cfg.ppo_n_minibatches):
        engine.train_batch(mb, ppo_loss_fn(actor_cfg), loss_weight_fn(actor_cfg))

Batch keys (right-padded [B, L] unless noted): input_ids, attention_mask, loss_mask,
logprobs (behaviour, from the inference servers), rewards [B]; added here: advantages.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .advantages import broadcast_to_tokens, compute_advantages, scale_rewards
from .masked import aggregate, aggregation_weight, masked_mean
from .ppo import kl_penalty, ppo_actor_loss


def prepare_ppo_batch(batch: dict[str, Any], cfg, *, group_size: int) -> dict[str, Any]:
    """Shape rewards (bias, scaling, clip), normalise them into advantages and put them on tokens."""
    rewards = scale_rewards(batch["rewards"], scaling=cfg.reward_scaling, bias=cfg.reward_bias,
                            clip=cfg.reward_clip)
    adv = compute_advantages(rewards, mode=cfg.adv_norm, group_size=group_size, std=cfg.adv_norm_std)
    out = dict(batch)
    out["rewards"] = rewards
    out["advantages"] = broadcast_to_tokens(adv, batch["loss_mask"])
    return out


def ppo_loss_fn(cfg) -> Callable:
    """loss_fn(logprobs, entropy, mb) -> (loss, stats) for FSDPEngine.train_batch (an ActorConfig)."""
    if cfg.use_decoupled_loss and not cfg.recompute_logprob:
        raise ValueError("actor.use_decoupled_loss needs actor.recompute_logprob=true "
                         "(the proximal logprobs come from the trainer)")

    def loss_fn(logprobs: torch.Tensor, entropy: torch.Tensor, mb: dict[str, Any]):
        mask = mb["loss_mask"]
        behav = mb["logprobs"]
        prox = _require(mb, "prox_logprobs", "actor.recompute_logprob") if cfg.recompute_logprob else behav
        loss, stats = ppo_actor_loss(
            logprobs, prox, mb["advantages"], mask, eps_clip=cfg.eps_clip, c_clip=cfg.c_clip,
            behav_logprobs=behav if cfg.use_decoupled_loss else None,
            behav_imp_weight_cap=cfg.behav_imp_weight_cap, aggregation=cfg.token_aggregation)
        stats["pg_loss"] = loss.detach()
        if cfg.kl_ctl > 0:
            ref = _require(mb, "ref_logprobs", "actor.kl_ctl")
            kl = aggregate(kl_penalty(logprobs, ref, "k3"), mask, cfg.token_aggregation)
            loss = loss + cfg.kl_ctl * kl
            stats["kl_ref"] = kl.detach()
        stats["entropy"] = masked_mean(entropy.detach(), mask)
        return loss, stats

    return loss_fn


def loss_weight_fn(cfg) -> Callable[[dict[str, Any]], float]:
    """Weight of a micro-batch so weighted micro-batch losses equal the whole-batch aggregate."""
    return lambda mb: aggregation_weight(mb["loss_mask"], cfg.token_aggregation)


def split_minibatches(batch: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """n contiguous minibatches of whole sequences (PPO updates once per minibatch)."""
    size = batch["input_ids"].shape[0]
    if size % n:
        raise ValueError(f"{size} sequences do not split into actor.ppo_n_minibatches={n} minibatches")
    step = size // n
    return [{k: _rows(v, i * step, (i + 1) * step, size) for k, v in batch.items()} for i in range(n)]


def _rows(value, start: int, end: int, size: int):
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size:
        return value[start:end]
    return value


def _require(mb: dict[str, Any], key: str, because: str) -> torch.Tensor:
    if key not in mb:
        raise KeyError(f"the batch has no '{key}', needed because {because} is set; compute it "
                       f"with engine.forward(batch) before train_batch")
    return mb[key]
