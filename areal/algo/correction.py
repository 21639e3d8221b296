"""Rollout-policy correction: importance weights between the trainer and the inference servers.

The servers' sampled tokens come with their logprobs (`behav`, the behaviour policy); the
trainer recomputes them with its own weights before the update (`prox`, the proximal policy).
Even at the same weight version the two differ (other kernels, precision, batching), and in
asynchronous RL the servers may also lag by a few versions. The ratio

    rho = exp(prox - behav)          per token, or per sequence as the product over its tokens

reweights the loss from the behaviour's samples towards the trainer's policy. Raw, it is the
decoupled PPO loss's behaviour weight (areal.algo.ppo); here it is bounded by a cap C:

    tis  truncated importance sampling: min(rho, C)
    mis  masked importance sampling: rho where rho <= C, else 0 (the token, or the whole
         sequence, drops out of the loss; the normaliser is unchanged)

Sequence-level weights put one weight on every token of a sequence. All weights are statistics
(no gradient). `mismatch_sums` / `mismatch_metrics` measure the gap every step.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

RolloutIS = Literal["none", "tis", "mis"]
ISLevel = Literal["token", "sequence"]


def log_is_ratio(
    prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor, loss_mask: torch.Tensor, level: ISLevel
) -> torch.Tensor:
    """log rho on every token [B, L]: the token's own (token) or its sequence's sum over loss
    tokens (sequence); 0 off the loss mask at token level."""
    mask = loss_mask.bool()
    d = torch.where(mask, prox_logprobs - behav_logprobs, torch.zeros_like(prox_logprobs))
    if level == "token":
        return d
    if level == "sequence":
        return d.sum(-1, keepdim=True).expand_as(d)
    raise ValueError(f"rollout_is_level={level!r} is not one of 'token', 'sequence' (set actor.rollout_is_level)")


def rollout_is_weights(
    prox_logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    mode: RolloutIS,
    level: ISLevel,
    cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [B, L], capped [B, L] bool): the corrected importance weight of every loss token
    (0 off the mask) and which loss tokens were truncated (tis) or masked (mis) because rho > cap."""
    if mode not in ("tis", "mis"):
        raise ValueError(f"rollout_is={mode!r} has no weights: use 'tis' or 'mis' (set actor.rollout_is)")
    if cap <= 0:
        raise ValueError(f"rollout_is_cap={cap} must be positive (set actor.rollout_is_cap)")
    mask = loss_mask.bool()
    log_w = log_is_ratio(prox_logprobs.detach(), behav_logprobs.detach(), loss_mask, level)
    log_cap = math.log(cap)
    capped = mask & (log_w > log_cap)
    w = torch.exp(log_w.clamp(max=log_cap))  # never overflows; equals rho wherever rho <= cap
    if mode == "mis":
        w = torch.where(capped, torch.zeros_like(w), w)
    return torch.where(mask, w, torch.zeros_like(w)), capped


def mismatch_sums(
    prox_logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    level: ISLevel,
    cap: float | None,
) -> dict[str, torch.Tensor]:
    """Sufficient statistics of the trainer/server mismatch over a batch (float64 0-d tensors),
    to be summed over ranks (weight_max: max) before `mismatch_metrics`.

    kl_sum: sum over loss tokens of the k3 estimate of KL(behaviour || trainer) from the
    behaviour's samples, rho - 1 - log rho (rho per token; >= 0, 0 when they agree);
    weight_sum / weight_max / units: the raw rho at `level` (units: loss tokens, or sequences
    with loss tokens); capped: units whose rho exceeds `cap` (0 when cap is None).
    """
    mask = loss_mask.bool()
    d = (prox_logprobs.double() - behav_logprobs.double())[mask]
    kl_sum = (torch.exp(d) - 1.0 - d).sum()
    if level == "token":
        log_w = d
    else:
        rows = mask.any(-1)
        log_w = log_is_ratio(prox_logprobs.double(), behav_logprobs.double(), loss_mask, level)[rows, 0]
    w = torch.exp(log_w)
    zero = torch.zeros((), dtype=torch.float64, device=w.device)
    return {
        "kl_sum": kl_sum,
        "tokens": mask.sum().double(),
        "weight_sum": w.sum(),
        "weight_max": w.max() if w.numel() else zero,
        "units": torch.tensor(float(w.numel()), dtype=torch.float64, device=w.device),
        "capped": (w > cap).sum().double() if cap is not None else zero,
    }


def mismatch_metrics(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """The logged figures from (rank-summed) `mismatch_sums`: mismatch/kl (per loss token),
    mismatch/is_weight_mean and mismatch/is_weight_max (raw rho, before any cap), and
    mismatch/is_capped_frac (share of tokens or sequences above the cap)."""
    tokens, units = float(sums["tokens"]), float(sums["units"])
    if tokens == 0:
        return {}
    return {
        "mismatch/kl": float(sums["kl_sum"]) / tokens,
        "mismatch/is_weight_mean": float(sums["weight_sum"]) / max(units, 1.0),
        "mismatch/is_weight_max": float(sums["weight_max"]),
        "mismatch/is_capped_frac": float(sums["capped"]) / max(units, 1.0),
    }
