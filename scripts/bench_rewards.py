"""Rewards for benchmarks: a known success rate on random-weight models, whose answers are noise.

    workflow.reward_fn=bench_rewards:coin    (scripts/ on PYTHONPATH; BENCH_REWARD_P, default 0.5)

`coin` gives 1 with probability BENCH_REWARD_P, decided by a hash of the completion's tokens: the
same answer always gets the same reward, and different answers are independent draws. So a group
of n answers has all-equal rewards with probability p^n + (1 - p)^n, the share that dynamic
sampling drops (p = 0.25, n = 4: 32%).
"""

from __future__ import annotations

import hashlib
import os


def coin(prompt, completion, prompt_ids=None, completion_ids=None, **data) -> float:
    p = float(os.environ.get("BENCH_REWARD_P", "0.5"))
    key = repr(list(completion_ids) if completion_ids is not None else completion).encode()
    draw = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64
    return 1.0 if draw < p else 0.0
