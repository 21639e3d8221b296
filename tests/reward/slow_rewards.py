"""Reward functions for RewardRunner tests, importable by path from spawned workers."""

import os
import time
from pathlib import Path


def length_reward(prompt, completion, prompt_ids=None, completion_ids=None, **data):
    """len(completion), plus an optional `bonus` sample field."""
    return float(len(completion)) + data.get("bonus", 0.0)


def maybe_hang(prompt, completion, prompt_ids=None, completion_ids=None, pid_file=None, starts=None, **data):
    """Sleeps forever on "hang" (after writing its pid), for S seconds on "sleep:S", then len().
    "pid": this worker's pid. "busy": notes its pid in the file `starts`; the first start in that
    file then sleeps forever (until its worker is killed), later ones return len() at once."""
    if completion == "pid":
        return float(os.getpid())
    if completion.startswith("sleep:"):
        time.sleep(float(completion.split(":")[1]))
    if completion == "hang":
        if pid_file:
            Path(pid_file).write_text(str(os.getpid()))
        while True:
            time.sleep(3600)
    if completion == "busy":
        with open(starts, "a") as f:
            f.write(f"{os.getpid()}\n")
        if len(Path(starts).read_text().split()) == 1:
            while True:
                time.sleep(3600)
    return float(len(completion))


def raises(prompt, completion, prompt_ids=None, completion_ids=None, **data):
    raise ValueError(f"bad completion {completion!r}")


def not_a_number(prompt, completion, prompt_ids=None, completion_ids=None, **data):
    return "high"


def dies(prompt, completion, prompt_ids=None, completion_ids=None, marker=None, **data):
    """Its worker dies (SIGKILL) on "die"; on "die_once" only the first time (the file `marker`
    notes it), then len() like the others."""
    import signal

    if completion == "die" or (completion == "die_once" and not Path(marker).exists()):
        if marker:
            Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return float(len(completion))
