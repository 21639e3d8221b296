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
`areal.algo.correction` shapes that same weight differently (truncated or masked, per token or per
sequence); its weights come in as `is_weights` (docs/algorithms.md says how the two combine).

Loss shapes: the clip range may be asymmetric (eps_clip below, eps_clip_high above: DAPO's
"clip-higher"), and the ratio may be taken per sequence (GSPO: the geometric mean of the
sequence's token ratios, the same for each of its tokens).
"""

from __future__ import annotations

from typing import Literal

import torch

from .masked import Aggregation, aggregate, masked_mean

KLEstimator = Literal["k1", "k2", "k3"]
RatioLevel = Literal["token", "sequence"]


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(current || reference) from samples of the current policy.

    k1 = log p - log p_ref: unbiased but high variance and can be negative per token.
    k2 = (log p - log p_ref)^2 / 2: biased, always >= 0, low variance; its gradient is that of
    the squared log-ratio (the estimator that makes a KL penalty in the loss an exact
    reverse-KL gradient on on-policy samples).
    k3 = exp(log p_ref - log p) - (log p_ref - log p) - 1: unbiased, always >= 0, low variance
    (Schulman's "Approximating KL divergence"; the estimator of DeepSeek's GRPO). We default to k3
    because the penalty is added to the loss and must not reward moving away on single tokens.
    """
    d = ref_logprobs - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"KL estimator {estimator!r} is not one of 'k1', 'k2', 'k3' (set actor.kl_estimator)")


def sequence_log_ratio(logprobs: torch.Tensor, prox_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """GSPO's log importance ratio: per sequence, the mean over its loss tokens of
    (log p - log p_prox), put on every token of the sequence ([B, L]; 0 for a sequence without
    loss tokens). exp of it is the geometric mean of the token ratios; its gradient reaches every
    token of the sequence."""
    m = loss_mask.to(logprobs.dtype)
    per_seq = ((logprobs - prox_logprobs) * m).sum(-1) / m.sum(-1).clamp(min=1)
    return per_seq[:, None].expand_as(logprobs)


def entropy_bonus(logprobs: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """Per-token surrogate for the policy entropy H, to be maximised: its value is `entropy`
    (exact, a statistic without gradient) and its gradient is the score-function estimate
    (-log p(y) - H) * grad log p(y) of grad H from the sampled token y.

    Over y ~ p, E[-log p(y) grad log p(y)] = grad H, and H is a baseline (E[grad log p] = 0).
    Exact for on-policy samples; for stale ones it ignores the behaviour mismatch.
    """
    advantage = (-logprobs - entropy).detach()
    return entropy.detach() + advantage * (logprobs - logprobs.detach())


def ppo_actor_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
    c_clip: float | None = None,
    behav_logprobs: torch.Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    is_weights: torch.Tensor | None = None,
    aggregation: Aggregation = "token_mean",
    ratio_level: RatioLevel = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss (to minimise) and detached statistics.

    per token: max(-A r, -A clip(r, 1 - eps_clip, 1 + eps_clip_high)) (eps_clip_high None: the
    symmetric eps_clip); with dual clip (c_clip > 1) the loss of a negative-advantage token is
    additionally bounded by -A * c_clip, so a huge ratio cannot blow up the update.
    ratio_level="sequence" uses GSPO's ratio (`sequence_log_ratio`) instead of the token's.
    With `behav_logprobs` (decoupled) the term is multiplied by w = exp(prox - behav), and tokens
    with w > behav_imp_weight_cap are zeroed. `is_weights` ([B, L], from
    areal.algo.correction) multiply the term instead; passing both is an error.
    """
    if behav_logprobs is not None and is_weights is not None:
        raise ValueError(
            "pass behav_logprobs (the decoupled weight) or is_weights (a rollout "
            "correction's weight), not both: they weight by the same ratio"
        )
    mask = loss_mask.bool()
    ratio = torch.exp(_log_ratio(logprobs, prox_logprobs, loss_mask, ratio_level))
    pg, clipped, dual_clipped = _clipped_surrogate(ratio, advantages, mask, eps_clip, eps_clip_high, c_clip)
    stats: dict[str, torch.Tensor] = {}
    if behav_logprobs is not None:
        weight, stats = _behaviour_weight(prox_logprobs, behav_logprobs, mask, behav_imp_weight_cap)
        pg = pg * weight
    if is_weights is not None:
        pg = pg * is_weights.detach()
    loss = aggregate(pg, mask, aggregation)
    stats.update(_clip_stats(ratio, clipped, dual_clipped, logprobs, prox_logprobs, mask))
    return loss, {k: v.detach() for k, v in stats.items()}


def _log_ratio(
    logprobs: torch.Tensor, prox_logprobs: torch.Tensor, loss_mask: torch.Tensor, ratio_level: RatioLevel
) -> torch.Tensor:
    """log(current / proximal) per token, or GSPO's per-sequence mean of it on every token."""
    if ratio_level == "token":
        return logprobs - prox_logprobs
    if ratio_level == "sequence":
        return sequence_log_ratio(logprobs, prox_logprobs, loss_mask)
    raise ValueError(f"ratio_level={ratio_level!r} is not one of 'token', 'sequence' (set actor.ratio_level)")


def _clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float | None,
    c_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-token clipped loss, and where the clip and the dual clip (c_clip) bound it."""
    high = eps_clip if eps_clip_high is None else eps_clip_high
    clipped_ratio = ratio.clamp(1.0 - eps_clip, 1.0 + high)
    loss1, loss2 = -advantages * ratio, -advantages * clipped_ratio
    pg = torch.maximum(loss1, loss2)
    clipped = loss2 > loss1
    dual_clipped = torch.zeros_like(mask)
    if c_clip is not None:
        bound = -advantages * c_clip
        dual_clipped = (advantages < 0) & (pg > bound)
        pg = torch.where(dual_clipped, bound, pg)
    return pg, clipped, dual_clipped


def _behaviour_weight(
    prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor, mask: torch.Tensor, cap: float | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled PPO's per-token weight w = exp(prox - behav) (no gradient), 0 on tokens whose w
    exceeds `cap`, and its statistics."""
    stats: dict[str, torch.Tensor] = {}
    weight = torch.exp(prox_logprobs - behav_logprobs).detach()
    keep = mask
    if cap is not None:
        keep = mask & (weight <= cap)
        stats["behav_capped_frac"] = masked_mean((~keep).float(), mask)
    weight = torch.where(keep, weight, torch.zeros_like(weight))
    stats["behav_imp_weight"] = masked_mean(weight, keep)
    return weight, stats


def _clip_stats(
    ratio: torch.Tensor,
    clipped: torch.Tensor,
    dual_clipped: torch.Tensor,
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """How often each clip bound the loss, the mean ratio, and approx_kl: the mean of log prox - log current."""
    with torch.no_grad():
        return dict(
            clip_frac=masked_mean(clipped.float(), mask),
            clip_low_frac=masked_mean((clipped & (ratio < 1.0)).float(), mask),
            clip_high_frac=masked_mean((clipped & (ratio > 1.0)).float(), mask),
            dual_clip_frac=masked_mean(dual_clipped.float(), mask),
            importance_ratio=masked_mean(ratio, mask),
            approx_kl=masked_mean(prox_logprobs - logprobs, mask),
        )
