"""Bounded staleness as arithmetic: how many more rollouts may start now.

Why a bound: a rollout started under weight version v is trained on at the earliest at step v.
If the trainer consumes `consumer_batch_size` rollouts per step and a sample may lag at most
`max_head_offpolicyness` versions, then by the time the trainer is at version v no more than
`(max_head_offpolicyness + v + 1) * consumer_batch_size` rollouts may ever have been started
(running ones plus accepted ones). Independently, `max_concurrent_rollouts` caps how many run
at once so servers are not flooded. With max_head_offpolicyness = 0 this is synchronous RL:
exactly one batch per version.
"""

from __future__ import annotations


def staleness_limit(version: int, max_head_offpolicyness: int, consumer_batch_size: int) -> int:
    """Most rollouts that may have been started (running + accepted) at weight `version`."""
    return (max_head_offpolicyness + version + 1) * consumer_batch_size


def capacity(
    *,
    version: int,
    max_head_offpolicyness: int,
    consumer_batch_size: int,
    max_concurrent: int,
    running: int,
    accepted: int,
) -> int:
    """Rollouts that may start now without breaking either bound (never negative)."""
    by_concurrency = max_concurrent - running
    by_staleness = staleness_limit(version, max_head_offpolicyness, consumer_batch_size) - (running + accepted)
    return max(0, min(by_concurrency, by_staleness))
