"""Joining trajectories into one right-padded batch of tensors.

Each workflow result is a dict of tensors with a leading sample dimension: token-level ones are
[n, L] (L may differ between results), sequence-level ones are [n]. The batch concatenates the
samples and right-pads token-level tensors to the longest L. Padding is 0 (attention_mask and
loss_mask are 0 there, so padded positions count nowhere) except `versions`, padded with -1 like
prompt tokens, so "version >= 0" always means "a generated token".
"""

from __future__ import annotations

from typing import Any

PAD_VALUES = {"versions": -1}


def concat_padded(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    """One batch dict from many trajectory dicts (all with the same keys); {} for no input."""
    import torch

    if not trajectories:
        return {}
    keys = list(trajectories[0])
    for i, t in enumerate(trajectories):
        if set(t) != set(keys):
            raise ValueError(
                f"trajectory {i} has keys {sorted(t)} but trajectory 0 has {sorted(keys)}; "
                "a workflow must return the same keys for every episode"
            )
    width = max((t[k].shape[1] for t in trajectories for k in keys if t[k].dim() >= 2), default=0)
    out = {}
    for k in keys:
        parts = [t[k] for t in trajectories]
        if parts[0].dim() >= 2:
            parts = [_pad_right(p, width, PAD_VALUES.get(k, 0)) for p in parts]
        out[k] = torch.cat(parts, dim=0)
    return out


def _pad_right(x, width: int, value):
    import torch.nn.functional as F

    extra = width - x.shape[1]
    if extra == 0:
        return x
    pad = [0, 0] * (x.dim() - 2) + [0, extra]
    return F.pad(x, pad, value=value)


def pad_sequences(rows: list[list], value, dtype) -> "Any":
    """A [len(rows), max_len] tensor of Python lists, right-padded with `value`.

    Through a numpy array filled row by row: in an async run this runs on the rollout thread,
    whose every millisecond holding the GIL is one the training thread waits, and numpy converts
    padded nested lists faster than torch.tensor does.
    """
    import numpy as np
    import torch

    width = max((len(r) for r in rows), default=0)
    if dtype == torch.bfloat16:  # numpy has no bfloat16: fill float32, then cast
        return pad_sequences(rows, value, torch.float32).to(dtype)
    out = np.full((len(rows), width), value, dtype=torch.empty((), dtype=dtype).numpy().dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)


STAT_PREFIX = "stat/"  # per-sample figures a workflow adds to its rows, e.g. stat/agent/calls


def sample_stats(batch: dict[str, Any]) -> dict[str, float]:
    """The mean of each per-sample figure of a batch (keys `stat/<name>`) as `rollout/<name>`."""
    return {
        f"rollout/{key.removeprefix(STAT_PREFIX)}": float(value.float().mean())
        for key, value in batch.items()
        if key.startswith(STAT_PREFIX) and value.numel()
    }
