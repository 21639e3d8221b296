"""What the GPU engine tests share: the 0.5B-shaped model folder and a plain NLL loss."""

from __future__ import annotations

import pytest
from model_shapes import build_model_dir


@pytest.fixture(scope="module")
def qwen_05b(tmp_path_factory):
    return build_model_dir("qwen2.5-0.5b", tmp_path_factory.mktemp("qwen"))


def nll(logprobs, entropy, mb):
    mask = mb["loss_mask"].bool()
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1), {}


def token_weight(mb):
    return float(mb["loss_mask"].sum())
