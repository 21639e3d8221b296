"""The PPO clipped objective, its decoupled (asynchronous) variant and the KL penalty.

All inputs are per token, [B, L], aligned with input_ids: logprobs[i, j] = log p(token j | < j).
`loss_mask` is 1 on generated tokens.

Decoupled PPO (AReaL, "asynchronous RL with stale rollouts"): three policies are involved.
  behaviour  the (possibly stale) weights that generated the tokens (`behav_logprobs`)
  proximal   the trainer's weights before this update, recomputed by the trainer (`prox_logprobs`)
  current    the weights being optimised (`logprobs`)
The trust region is taken around the proximal policy (ratio = exp(cur - prox)), and the
off-policyness of the sample is corrected by the behaviour importance weight
w = exp(prox - behav) (no gradient). Tokens with w above `behav_imp_weight_cap` are dropped from
the loss (their term is zeroed, the normaliser is unchanged, as in AReaL), because a huge weight
means the sample is too stale to be trusted. Without decoupling, prox is the behaviour policy.
"""

from __future__ import annotations

from typing import Literal

import torch

from .masked import Aggregation, aggregate, masked_mean

KLEstimator = Literal["k1", "k3"]


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(current || reference) from samples of the current policy.

    k1 = log p - log p_ref: unbiased but high variance and can be negative per token.
    k3 = exp(log p_ref - log p) - (log p_ref - log p) - 1: unbiased, always >= 0, low variance
    (Schulman's "Approximating KL divergence"; the estimator of DeepSeek's GRPO). We default to k3
    because the penalty is added to the loss and must not reward moving away on single tokens.
    """
    d = ref_logprobs - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"KL estimator {estimator!r} is not one of 'k1', 'k3'")


def ppo_actor_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    eps_clip: float,
    c_clip: float | None = None,
    behav_logprobs: torch.Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    aggregation: Aggregation = "token_mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss (to minimise) and detached statistics.

    per token: max(-A r, -A clip(r, 1-eps, 1+eps)); with dual clip (c_clip > 1) the loss of a
    negative-advantage token is additionally bounded by -A * c_clip, so a huge ratio cannot blow
    up the update. With `behav_logprobs` (decoupled) the term is multiplied by
    w = exp(prox - behav), and tokens with w > behav_imp_weight_cap are zeroed.
    """
    mask = loss_mask.bool()
    ratio = torch.exp(logprobs - prox_logprobs)
    clipped_ratio = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip)
    loss1, loss2 = -advantages * ratio, -advantages * clipped_ratio
    pg = torch.maximum(loss1, loss2)
    clipped = loss2 > loss1
    dual_clipped = torch.zeros_like(mask)
    if c_clip is not None:
        bound = -advantages * c_clip
        dual_clipped = (advantages < 0) & (pg > bound)
        pg = torch.where(dual_clipped, bound, pg)
    stats: dict[str, torch.Tensor] = {}
    if behav_logprobs is not None:
        weight = torch.exp(prox_logprobs - behav_logprobs).detach()
        keep = mask
        if behav_imp_weight_cap is not None:
            keep = mask & (weight <= behav_imp_weight_cap)
            stats["behav_capped_frac"] = masked_mean((~keep).float(), mask)
        weight = torch.where(keep, weight, torch.zeros_like(weight))
        pg = pg * weight
        stats["behav_imp_weight"] = masked_mean(weight, keep)
    loss = aggregate(pg, mask, aggregation)
    with torch.no_grad():
        stats.update(
            clip_frac=masked_mean(clipped.float(), mask),
            dual_clip_frac=masked_mean(dual_clipped.float(), mask),
            importance_ratio=masked_mean(ratio, mask),
            approx_kl=masked_mean(prox_logprobs - logprobs, mask),
        )
    return loss, {k: v.detach() for k, v in stats.items()}
