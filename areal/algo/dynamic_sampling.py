"""Dynamic sampling (DAPO): which rollout groups carry a learning signal.

Under group-normalised advantages a group whose answers all got the same reward has advantage 0
on every token: it costs a training step's compute and only dilutes the loss. Dynamic sampling
drops such groups as they finish and has more prompts generated until the batch is full
(areal.rollout.executor does the generating; `rollout.dynamic_sampling` turns it on).

One episode of the built-in workflows is one group: the n_samples answers to one prompt.
"""

from __future__ import annotations

from typing import Any

import torch


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N] rewards in contiguous groups -> [N / group_size] bool: True where the group's rewards
    are all equal (exactly: a spread of 0, however small the reward values)."""
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of {group_size} "
            "(gconfig.n_samples must divide the number of sequences)"
        )
    r = rewards.view(-1, group_size)
    return r.amax(dim=1) == r.amin(dim=1)


def has_reward_variance(trajectory: dict[str, Any]) -> bool:
    """The `should_accept` of dynamic sampling for one episode (one group): keep it when its
    rewards are not all equal. A group of one answer has no variance."""
    rewards = trajectory["rewards"].reshape(-1)
    return bool(rewards.numel() > 1 and not zero_variance_groups(rewards, rewards.numel())[0])


def filter_metrics(stats: dict[str, int]) -> dict[str, float]:
    """Per-step metrics from RolloutExecutor.last_batch_stats():
    rollout/dropped_groups_frac  dropped / (dropped + kept) groups among those generated for the batch
    rollout/extra_samples        samples generated beyond the batch (those of the dropped groups)
    rollout/kept_past_limit      groups in the batch kept only because rollout.max_overgeneration was reached
    """
    if not stats:
        return {}
    dropped, groups = stats["dropped_groups"], stats["groups"]
    return {
        "rollout/dropped_groups_frac": dropped / max(dropped + groups, 1),
        "rollout/extra_samples": float(stats["dropped_samples"]),
        "rollout/kept_past_limit": float(stats["kept_past_limit"]),
    }
