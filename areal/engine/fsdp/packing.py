"""Micro-batches by token budget, with sequence packing.

A padded batch [B, L] is cut into micro-batches whose real tokens fit `max_tokens_per_mb`
(first-fit decreasing; a sequence longer than the budget gets a micro-batch of its own, never
split). The sequences of one micro-batch are concatenated into a single row [1, T] with
position_ids restarting at 0 for each sequence, so no compute is spent on padding. Attention
must not cross sequence boundaries: the engine's default attention (attention.py) and
flash-attention take the boundaries as cu_seq_lens; plain SDPA and eager need the dense
block-diagonal causal mask from `block_causal_mask` (tests check each: packed logprobs equal
unpacked ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedMicroBatch:
    """One packed row and where its sequences came from."""

    indices: list[int]  # rows of the padded batch, in packing order
    seqlens: list[int]  # real tokens of each of those rows
    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T], restarting at 0 per sequence
    # [n] positions t of the row whose next token (t + 1) carries loss: the only rows whose logits
    # are needed (predicting_rows); None when every token's logprob is wanted
    head_rows: torch.Tensor | None = None
    # with shared prompts (shared_prompts.py): the positions of the tokens head_rows predict (else
    # head_rows + 1), each sequence's tokens in the row (for unpack), and the attention's segments
    head_targets: torch.Tensor | None = None
    token_index: torch.Tensor | None = None
    shared: object | None = None  # shared_prompts.SharedAttention

    @property
    def n_tokens(self) -> int:
        """Tokens the row computes: with shared prompts fewer than the sequences hold."""
        return int(self.input_ids.shape[1]) if self.token_index is not None else int(sum(self.seqlens))

    @property
    def is_dummy(self) -> bool:
        """A one-token filler that keeps every data-parallel rank in step; it carries no loss."""
        return not self.indices


def sequence_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Real-token counts of a right-padded mask; rejects left padding and holes."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    expect = torch.arange(mask.shape[1], device=mask.device)[None, :] < lengths[:, None]
    if not torch.equal(mask, expect):
        raise ValueError(
            "attention_mask must be right-padded (ones, then zeros) in every row; "
            "left-padded or holed batches are not supported"
        )
    return lengths.tolist()


def allocate(lengths: list[int], max_tokens: int, min_count: int = 1) -> list[list[int]]:
    """Group sequence indices into bins of at most max_tokens tokens (first-fit decreasing).

    Returns at least `min_count` bins: bins are split (largest sequence count first) and, when
    no bin can be split further, empty bins are added. Data-parallel ranks call this with the
    maximum count over ranks, because FSDP's collectives need the same number of forward and
    backward passes on every rank.
    """
    if max_tokens < 1:
        raise ValueError(f"actor.max_tokens_per_mb={max_tokens} must be >= 1")
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    while len(bins) < min_count:
        splittable = [b for b in bins if len(b) > 1]
        if not splittable:
            bins.append([])
            continue
        big = max(splittable, key=len)
        bins.remove(big)
        bins += [big[: len(big) // 2], big[len(big) // 2 :]]
    return [sorted(b) for b in bins]


def pack(
    input_ids: torch.Tensor,
    lengths: list[int],
    indices: list[int],
    pad_id: int = 0,
    loss_mask: torch.Tensor | None = None,
) -> PackedMicroBatch:
    """Concatenate the real tokens of rows `indices` into one row (a dummy token when empty).

    loss_mask ([B, L], on the CPU): keep the logits of the tokens it marks only (head_rows)."""
    if not indices:
        ids = torch.full((1, 1), pad_id, dtype=input_ids.dtype, device=input_ids.device)
        return PackedMicroBatch([], [], ids, torch.zeros_like(ids))
    seqlens = [lengths[i] for i in indices]
    ids = torch.cat([input_ids[i, : lengths[i]] for i in indices])[None]
    pos = torch.cat([torch.arange(n, device=input_ids.device) for n in seqlens])[None]
    rows = None
    if loss_mask is not None:
        rows = predicting_rows(torch.cat([loss_mask[i, : lengths[i]] for i in indices]), seqlens)
    return PackedMicroBatch(list(indices), seqlens, ids, pos, rows)


def predicting_rows(loss_mask: torch.Tensor, seqlens: list[int]) -> torch.Tensor | None:
    """The positions t of a packed row whose logits predict a loss token (loss_mask[t + 1] set,
    t + 1 not a sequence's first token, which nothing predicts): [n] int64, at least one position,
    so that every micro-batch keeps a graph for backward.

    Prompts and tool outputs carry no loss: in a GRPO batch of 235-token prompts and 192 generated
    tokens the lm_head and the vocabulary-wide kernels then run on 45% of the rows (TRL's
    logits_to_keep does the same for a padded batch). Computed on the CPU: nonzero() on a GPU would
    stall the host until the device caught up."""
    if sum(seqlens) < 2:
        return None  # one token: nothing to predict, the full path handles it
    target = loss_mask.bool().clone()
    target &= ~_starts(seqlens, target.device)
    rows = torch.nonzero(target[1:]).squeeze(1)
    return rows if rows.numel() else torch.zeros(1, dtype=torch.long)


def unpack(values: torch.Tensor, mb: PackedMicroBatch, width: int) -> torch.Tensor:
    """[T] packed per-token values -> [len(indices), width] right-padded with zeros."""
    if mb.token_index is not None:  # shared prompts: each sequence's tokens, its prompt's repeated
        values = values[mb.token_index.to(values.device)]
    out = values.new_zeros(len(mb.indices), width)
    for row, chunk in enumerate(torch.split(values, mb.seqlens)):
        out[row, : chunk.numel()] = chunk
    return out


def block_causal_mask(seqlens: list[int], *, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[1, 1, T, T] causal mask that also blocks attention across packed sequences.

    Boolean (True = attend) for SDPA; with a float dtype an additive mask (0 / dtype min), which
    the eager attention path needs.
    """
    seg = torch.repeat_interleave(torch.arange(len(seqlens), device=device), torch.tensor(seqlens, device=device))
    t = seg.numel()
    allowed = (seg[:, None] == seg[None, :]) & torch.ones(t, t, dtype=torch.bool, device=device).tril()
    if dtype is None or dtype == torch.bool:
        return allowed[None, None]
    mask = torch.zeros(t, t, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def scatter_to_tokens(lp: torch.Tensor, ent: torch.Tensor | None, targets: torch.Tensor, n_tokens: int):
    """Figures of the kept rows ([n]: row i is about the token at position targets[i]) -> per-token
    [n_tokens], 0 at every token no kept row predicts (differentiable in lp)."""
    lp = lp.new_zeros(n_tokens).index_put((targets,), lp)
    ent = None if ent is None else ent.new_zeros(n_tokens).index_put((targets,), ent)
    return lp, ent


def align_to_tokens(lp: torch.Tensor, ent: torch.Tensor | None, seqlens: list[int]):
    """Next-token figures of a packed row ([T - 1]: row t is about token t + 1) -> per-token [T],
    0 at the first token of every packed sequence (nothing predicts it)."""
    starts = _starts(seqlens, lp.device)
    lp = torch.cat([lp.new_zeros(1), lp]).masked_fill(starts, 0.0)
    ent = None if ent is None else torch.cat([ent.new_zeros(1), ent]).masked_fill(starts, 0.0)
    return lp, ent


def _starts(seqlens: list[int], device) -> torch.Tensor:
    total = int(sum(seqlens))
    flags = torch.zeros(total, dtype=torch.bool, device=device)
    offsets = torch.tensor([0] + list(seqlens[:-1]), device=device).cumsum(0)
    flags[offsets] = True
    return flags
