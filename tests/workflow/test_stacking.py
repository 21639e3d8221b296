"""A GRPO group stacked at once (stack_group) against the per-sample path it replaces in RLVR
(trajectory per sample, then stack_samples): the same tensors, dtypes and padding."""

import random

import pytest
import torch

from areal.workflow.common import stack_group, stack_samples, trajectory


def random_group(rng, prompt_len, n, max_new):
    prompt = [rng.randrange(1, 50_000) for _ in range(prompt_len)]
    outputs = []
    for _ in range(n):
        length = rng.randint(0, max_new)
        outputs.append(
            (
                [rng.randrange(1, 50_000) for _ in range(length)],
                [rng.uniform(-8.0, 0.0) for _ in range(length)],
                [rng.choice([3, 4, 5]) for _ in range(length)],
            )
        )
    return prompt, outputs, [rng.random() for _ in range(n)]


@pytest.mark.parametrize(
    "prompt_len, n, max_new",
    [(200, 8, 32), (37, 8, 192), (5, 3, 0), (0, 2, 4), (12, 1, 7)],
    ids=["gsm8k_like", "long_answers", "empty_answers", "no_prompt", "one_sample"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_stack_group_equals_the_per_sample_path(prompt_len, n, max_new, seed):
    prompt, outputs, rewards = random_group(random.Random(seed), prompt_len, n, max_new)
    expected = stack_samples([trajectory(prompt, [(*out, True)]) for out in outputs], rewards)
    got = stack_group(prompt, outputs, rewards)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key].dtype == expected[key].dtype, key
        assert torch.equal(got[key], expected[key]), key
