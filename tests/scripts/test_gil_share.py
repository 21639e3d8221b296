"""scripts/dev/gil_share.py: per-thread shares and top stacks of a py-spy raw profile."""

import pytest

from tests.scripts import load_script

gil_share = load_script("dev/gil_share")

RAW = """\
thread (10): MainThread;train (grpo.py:40);forward (model.py:10) 6
thread (10): MainThread;train (grpo.py:40);backward (model.py:20) 2
thread (11): rollout-executor;_episode (executor.py:340);agenerate (client.py:205) 2
"""


def test_shares_by_thread_and_top_stacks(tmp_path):
    path = tmp_path / "gil_1_10.txt"
    path.write_text(RAW)
    out = gil_share.summarise(str(path), top=2)
    assert out["samples"] == 10
    assert out["share_by_thread"] == {"MainThread": 0.8, "rollout-executor": 0.2}
    assert out["top_stacks"][0] == [
        0.6,
        "MainThread | forward (model.py:10) <- train (grpo.py:40) <- thread (10): MainThread",
    ]
    assert len(out["top_stacks"]) == 2


def test_a_file_that_is_not_a_raw_profile_is_named(tmp_path):
    path = tmp_path / "gil_workers.txt"
    path.write_text("04:00:01 pid 123: python -m areal.trainer.main \n")
    with pytest.raises(ValueError, match="gil_workers.txt"):
        gil_share.summarise(str(path), top=3)
