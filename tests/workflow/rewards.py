"""Reward functions for workflow tests, importable by spec from spawned reward workers."""

import time
from pathlib import Path


def always_one(prompt, completion, prompt_ids, completion_ids, **data):
    return 1.0


def always_minus_one(prompt, completion, prompt_ids, completion_ids, **data):
    return -1.0


def n_tokens(prompt, completion, prompt_ids, completion_ids, **data):
    """The completion's token count (lets a test tie each reward to its trajectory row)."""
    return float(len(completion_ids))


def checks_fields(prompt, completion, prompt_ids, completion_ids, **data):
    """1.0 when the record's fields and the decoded prompt arrive as documented."""
    ok = data.get("solution") == "3" and "1+2=" in prompt and "question" in data and "prompt" not in data
    return 1.0 if ok and isinstance(completion, str) else 0.0


def hang(prompt, completion, prompt_ids, completion_ids, marker=None, **data):
    """Hangs; first creates the file `marker` (a record field), if given: the hang has begun."""
    if marker:
        Path(marker).touch()
    time.sleep(3600)
    return 1.0
