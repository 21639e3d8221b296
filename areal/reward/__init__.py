"""Reward functions and the machinery to call them safely.

Every reward has one signature,
`fn(prompt, completion, prompt_ids, completion_ids, **sample_fields) -> float`, and is named in
configs by a spec: a built-in name (`gsm8k`, `arith_shaped`, `arith_near`, `arith_exact`) or an import path
`package.module:function`. `resolve_reward_fn(spec)` gives the callable; `RewardRunner(spec, ...)`
calls it in worker processes with a timeout (what the rollout executor uses).

Only the stdlib is imported here; reward modules import what they need when resolved.
"""

from areal.reward.registry import BUILTIN_REWARDS, import_object, resolve_reward_fn
from areal.reward.runner import RewardRunner, run_reward_with_timeout

__all__ = [
    "BUILTIN_REWARDS",
    "RewardRunner",
    "import_object",
    "resolve_reward_fn",
    "run_reward_with_timeout",
]
