"""Masked reductions shared by the losses: every per-token quantity is [B, L] with a 0/1 mask."""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean", "seq_mean_token_sum"]
AGGREGATIONS = ("token_mean", "seq_mean", "seq_mean_token_sum")


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
    seq_mean_token_sum: sum per sequence, then the mean over sequences that have loss tokens
    (Dr. GRPO): no division by the answer's own length, so a token's weight does not depend on
    how long its answer is; the loss is about (mean answer length) times token_mean's.
    """
    if mode == "token_mean":
        return masked_mean(x, mask)
    if mode in ("seq_mean", "seq_mean_token_sum"):
        m = mask.to(x.dtype)
        per_seq_count = m.sum(-1)
        per_seq = torch.where(mask.bool(), x, torch.zeros_like(x)).sum(-1)
        if mode == "seq_mean":
            per_seq = per_seq / per_seq_count.clamp(min=1)
        has_tokens = per_seq_count > 0
        return per_seq[has_tokens].sum() / has_tokens.sum().clamp(min=1)
    raise ValueError(_unknown(mode))


def aggregation_weight(mask: torch.Tensor, mode: Aggregation) -> float:
    """How much a micro-batch counts when its aggregated loss is averaged with others.

    Combining micro-batch means weighted by this value reproduces `aggregate` over the whole
    batch: tokens for token_mean, sequences with loss tokens for seq_mean and seq_mean_token_sum.
    """
    if mode == "token_mean":
        return float(mask.sum())
    if mode in ("seq_mean", "seq_mean_token_sum"):
        return float((mask.sum(-1) > 0).sum())
    raise ValueError(_unknown(mode))


def _unknown(mode) -> str:
    return (
        f"token_aggregation={mode!r} is not one of {', '.join(map(repr, AGGREGATIONS))} (set actor.token_aggregation)"
    )
