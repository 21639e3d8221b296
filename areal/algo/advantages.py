"""Reward shaping and GRPO advantages: pure functions on tensors.

Rewards are per sequence ([N]); sequences of one prompt are contiguous groups of `group_size`
(the rollout produces n_samples answers per prompt in order). Advantages are per sequence and
are broadcast onto the answer tokens with `broadcast_to_tokens`.
"""

from __future__ import annotations

from typing import Literal

import torch

AdvNorm = Literal["group", "batch", "none"]


def scale_rewards(
    rewards: torch.Tensor, *, scaling: float = 1.0, bias: float = 0.0, clip: float | None = None
) -> torch.Tensor:
    """(r + bias) * scaling, then clipped to [-clip, clip] (AReaL's reward_bias/scaling/clip order)."""
    out = (rewards.float() + bias) * scaling
    if clip is not None:
        out = out.clamp(-clip, clip)
    return out


def overlong_penalty(lengths: torch.Tensor, *, max_len: int, buffer_len: float, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward of each sequence ([N] -> [N]).

    0 for answers of at most max_len - buffer_len tokens; inside the last `buffer_len` tokens of
    the budget it falls linearly to -factor at max_len (and stays there beyond). So an answer cut
    off by the budget is penalised, and the penalty warns before the cut.
    """
    if buffer_len <= 0:
        raise ValueError(
            f"overlong buffer of {buffer_len} tokens: it must be positive "
            "(set actor.overlong_buffer_frac > 0, or leave it 0 to disable the penalty)"
        )
    excess = (lengths.float() - (max_len - buffer_len)).clamp(min=0) / buffer_len
    return -factor * excess.clamp(max=1.0)


def group_normalize(rewards: torch.Tensor, group_size: int, *, std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: (r - mean of its group) / (std of its group + eps).

    The std is the population std (divide by n, not n - 1), so a group {0, 1} gives advantages
    of about +-1 regardless of the group size convention. A group whose answers all got the same
    reward gets advantage 0: it carries no learning signal.
    """
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of {group_size} "
            "(gconfig.n_samples must divide the number of sequences)"
        )
    r = rewards.float().view(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if std:
        sd = r.std(dim=1, unbiased=False, keepdim=True)
        adv = torch.where(sd > 0, adv / (sd + eps), torch.zeros_like(adv))  # eps=0 must not give NaN
    return adv.view(-1)


def batch_normalize(rewards: torch.Tensor, *, std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Like group_normalize with one group spanning the whole batch."""
    return group_normalize(rewards, rewards.numel(), std=std, eps=eps)


def compute_advantages(
    rewards: torch.Tensor, *, mode: AdvNorm, group_size: int, std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Per-sequence advantages under the configured normalisation (actor.adv_norm)."""
    if mode == "group":
        return group_normalize(rewards, group_size, std=std, eps=eps)
    if mode == "batch":
        return batch_normalize(rewards, std=std, eps=eps)
    if mode == "none":
        return rewards.float().clone()
    raise ValueError(f"adv_norm={mode!r} is not one of 'group', 'batch', 'none' (set actor.adv_norm)")


def broadcast_to_tokens(seq_values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """[N] per-sequence values -> [N, L] on loss tokens, 0 elsewhere (outcome reward, no discount)."""
    return seq_values.float()[:, None] * loss_mask.float()
