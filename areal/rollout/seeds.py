"""Sampling seeds of episodes, so that what an episode samples does not depend on timing.

The servers sample a request with a `sampling_seed` from random numbers that depend only on that
seed and the token's position (SGLang's sampling parameter; areal/server/sampling.py), not on the
other requests batched with it or their order, which HTTP arrival order decides. The rollout
executor gives every episode a seed from its record's place in the data stream (the loader's
seed, epoch, batch, offset), or from its submission order for a dataloader without positions,
and runs the episode with it as `episode_seed()`; a workflow derives one seed per request from
it (`request_seed`). The same data then draws the same numbers whether its batch was generated
synchronously or ahead of the trainer, and a recovered run that re-runs the episodes in flight at
its checkpoint draws what the interrupted run drew.
"""

from __future__ import annotations

import contextvars

_EPISODE_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("areal_episode_seed", default=None)
_MASK64 = (1 << 64) - 1


def mix(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64's finaliser after each): neighbouring inputs give
    unrelated seeds."""
    z = 0x243F6A8885A308D3
    for v in values:
        z = (z ^ (int(v) & _MASK64)) * 0x9E3779B97F4A7C15 & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z >> 1


def episode_seed() -> int | None:
    """The seed of the episode running in this asyncio task (the rollout executor sets it), or
    None outside one (then requests use the servers' own generators)."""
    return _EPISODE_SEED.get()


def request_seed(index: int) -> int | None:
    """The sampling_seed of the episode's `index`-th request (e.g. sample i of a group), or None."""
    seed = _EPISODE_SEED.get()
    return None if seed is None else mix(seed, index)


def set_episode_seed(seed: int | None) -> contextvars.Token:
    """Set the current task's episode seed (the executor, at the start of each episode)."""
    return _EPISODE_SEED.set(seed)
