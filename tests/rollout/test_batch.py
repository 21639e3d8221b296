"""Concatenating trajectories into one right-padded batch."""

import pytest
import torch

from areal.rollout.batch import concat_padded, pad_sequences


def traj(n, length, reward):
    return {
        "input_ids": torch.ones(n, length, dtype=torch.long),
        "attention_mask": torch.ones(n, length, dtype=torch.long),
        "versions": torch.zeros(n, length, dtype=torch.long),
        "rewards": torch.full((n,), reward),
    }


def test_pads_token_level_and_concatenates_sequence_level():
    b = concat_padded([traj(2, 3, 1.0), traj(1, 5, 0.0)])
    assert b["input_ids"].shape == (3, 5)
    assert b["attention_mask"].tolist()[0] == [1, 1, 1, 0, 0]
    assert b["versions"].tolist()[0] == [0, 0, 0, -1, -1]
    assert b["rewards"].tolist() == [1.0, 1.0, 0.0]


def test_mismatched_keys_and_empty():
    assert concat_padded([]) == {}
    bad = traj(1, 2, 0.0)
    del bad["versions"]
    with pytest.raises(ValueError, match="same keys"):
        concat_padded([traj(1, 2, 0.0), bad])


def test_pad_sequences():
    assert pad_sequences([[1], [2, 3]], -1, torch.long).tolist() == [[1, -1], [2, 3]]
    for dtype in (torch.float32, torch.bfloat16, torch.bool):
        out = pad_sequences([[1.0], []], 0, dtype)
        assert out.dtype == dtype and out.tolist() == [[1], [0]]
    assert pad_sequences([], 0, torch.long).shape == (0, 0)
