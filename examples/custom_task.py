"""A worked example of the three extension points, plugged in by import path from YAML
(docs/customization.md walks through it; tests/trainer/test_extensions.py runs it):

    train_dataset:
      type: examples.custom_task:load_doubling      # your dataset
    workflow:
      type: examples.custom_task:AnswerTwiceWorkflow # your workflow
      reward_fn: examples.custom_task:doubling_reward # your reward
"""

from __future__ import annotations

import random

from areal.workflow.rlvr import RLVRWorkflow


def load_doubling(split: str = "train", size: int = 64, seed: int = 0) -> list[dict]:
    """Records are plain dicts: `question` is the prompt; every field reaches the reward."""
    rng = random.Random(seed + (0 if split == "train" else 1))
    return [{"question": f"{n}+{n}=", "target": 2 * n} for n in (rng.randint(0, 4) for _ in range(size))]


def doubling_reward(prompt, completion, prompt_ids, completion_ids, target, **fields) -> float:
    """Rewards run in a worker process with a timeout: keep them importable top-level functions."""
    digits = "".join(ch for ch in completion if ch.isdigit())
    return 1.0 if digits == str(target) else 0.0


class AnswerTwiceWorkflow(RLVRWorkflow):
    """RLVR with the prompt written twice: a workflow only has to turn a record into tensors."""

    async def arun_episode(self, engine, data):
        return await super().arun_episode(engine, {**data, "question": data["question"] * 2})
