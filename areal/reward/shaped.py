"""Rewards for the synthetic arithmetic demo task (`areal.dataset.synthetic`).

Exact match alone does not teach a tiny model: early on all 8 samples of a prompt are wrong in
the same way, group-normalized advantages are zero, and learning stalls near chance. The shaped
reward gives partial credit for a well-formed number close to the target, so groups differ and
there is a gradient:

    1.0                                  exact answer
    0.5 * max(0, 1 - |pred - target| / 10)   another well-formed integer
    0.0                                  anything else

"Well-formed" is strict on purpose: the completion is just an integer ("7"), or ends with
GSM8K's "#### 7" line. Rewarding any number found in babble would teach babble.
"""

from __future__ import annotations

import re

NEAR_REACH = 3.0  # arith_near_reward: answers 3 or more away earn nothing
_INT_RE = re.compile(r"-?\d+")
_HASH_TAIL_RE = re.compile(r"####\s*(-?\d+)\s*", re.DOTALL)


def parse_arith_completion(completion: str) -> int | None:
    """The integer a completion answers with, or None when it is not well-formed."""
    text = completion.strip()
    if _INT_RE.fullmatch(text):
        return int(text)
    tail = text.rfind("####")
    if tail >= 0:
        match = _HASH_TAIL_RE.fullmatch(text[tail:])
        if match:
            return int(match.group(1))
    return None


def _target(data: dict) -> int:
    """The sample's integer solution; a missing or non-integer one is a dataset error."""
    try:
        return int(str(data["solution"]).strip())
    except (KeyError, ValueError):
        raise ValueError(
            "arithmetic rewards need an integer 'solution' field in each sample "
            f"(as areal.dataset.synthetic makes); got fields {sorted(data)}"
        ) from None


def arith_shaped_reward(prompt: str, completion: str, prompt_ids=None, completion_ids=None, **data) -> float:
    """1 for the exact answer, up to 0.5 for a close well-formed integer, else 0 (see module)."""
    return _closeness_reward(completion, data, reach=10.0)


def arith_near_reward(prompt: str, completion: str, prompt_ids=None, completion_ids=None, **data) -> float:
    """1 for the exact answer, 0.5 x (1 - |pred - target| / 3) for a well-formed integer within 2
    of it, else 0: the demo's reward.

    Partial credit that reaches only the neighbours keeps the gradient towards the right answer
    without making any one answer a safe bet. Under `arith_shaped`'s wide credit, a middle digit
    earns 0.3-0.5 on every low sum, and stalled runs answered "4" to all sums 0-3 and stopped
    sampling the digits 0-3 (measured with scripts/dev/sim_demo.py).
    """
    return _closeness_reward(completion, data, reach=NEAR_REACH)


def _closeness_reward(completion: str, data: dict, *, reach: float) -> float:
    """1 for the exact answer, 0.5 x (1 - distance / reach) for another well-formed integer, else 0."""
    target = _target(data)
    pred = parse_arith_completion(completion)
    if pred is None:
        return 0.0
    if pred == target:
        return 1.0
    return 0.5 * max(0.0, 1.0 - abs(pred - target) / reach)


def arith_exact_reward(prompt: str, completion: str, prompt_ids=None, completion_ids=None, **data) -> float:
    """1 for the exact well-formed answer, else 0: the accuracy the demo reports."""
    return 1.0 if parse_arith_completion(completion) == _target(data) else 0.0
