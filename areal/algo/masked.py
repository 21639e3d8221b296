"""Masked reductions shared by the losses: every per-token quantity is [B, L] with a 0/1 mask."""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean"]


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.zeros_like(x)).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over masked-in entries; 0 (not NaN) when the mask is empty, so empty micro-batches are harmless."""
    return masked_sum(x, mask) / mask.sum().clamp(min=1)


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: Aggregation) -> torch.Tensor:
    """Reduce a [B, L] per-token loss to a scalar.

    token_mean: every loss token weighs the same (long answers dominate).
    seq_mean: mean per sequence first, then over sequences that have loss tokens (each answer
    weighs the same, as in the original GRPO paper).
    """
    if mode == "token_mean":
        return masked_mean(x, mask)
    if mode == "seq_mean":
        m = mask.to(x.dtype)
        per_seq_count = m.sum(-1)
        per_seq = torch.where(mask.bool(), x, torch.zeros_like(x)).sum(-1) / per_seq_count.clamp(min=1)
        has_tokens = per_seq_count > 0
        return per_seq[has_tokens].sum() / has_tokens.sum().clamp(min=1)
    raise ValueError(f"token_aggregation={mode!r} is not one of 'token_mean', 'seq_mean' "
                     "(set actor.token_aggregation)")


def aggregation_weight(mask: torch.Tensor, mode: Aggregation) -> float:
    """How much a micro-batch counts when its aggregated loss is averaged with others.

    Combining micro-batch means weighted by this value reproduces `aggregate` over the whole
    batch: tokens for token_mean, sequences with loss tokens for seq_mean.
    """
    if mode == "token_mean":
        return float(mask.sum())
    if mode == "seq_mean":
        return float((mask.sum(-1) > 0).sum())
    raise ValueError(f"token_aggregation={mode!r} is not one of 'token_mean', 'seq_mean' "
                     "(set actor.token_aggregation)")
