"""Reward functions for RewardRunner tests, importable by path from spawned workers."""

import os
import time
from pathlib import Path


def length_reward(prompt, completion, prompt_ids=None, completion_ids=None, **data):
    """len(completion), plus an optional `bonus` sample field."""
    return float(len(completion)) + data.get("bonus", 0.0)


def maybe_hang(prompt, completion, prompt_ids=None, completion_ids=None, pid_file=None, **data):
    """Sleeps forever on "hang" (after writing its pid), for S seconds on "sleep:S", then len()."""
    if completion.startswith("sleep:"):
        time.sleep(float(completion.split(":")[1]))
    if completion == "hang":
        if pid_file:
            Path(pid_file).write_text(str(os.getpid()))
        while True:
            time.sleep(3600)
    return float(len(completion))


def raises(prompt, completion, prompt_ids=None, completion_ids=None, **data):
    raise ValueError(f"bad completion {completion!r}")


def not_a_number(prompt, completion, prompt_ids=None, completion_ids=None, **data):
    return "high"
