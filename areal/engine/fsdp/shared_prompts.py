"""actor.share_prompts: a prompt that several sequences of a micro-batch start with is computed once.

GRPO samples n answers per prompt, and the trainer forwarded and back-propagated each prompt n
times: at the 0.5B benchmark shape (235-token prompts, 192 generated tokens, n = 8) 52% of the
trained tokens were prompt copies. Here the sequences of one micro-batch that begin with the same
prompt (their tokens before the first loss token) are packed as that prompt once, followed by each
sequence's remainder (its "tail"). The attention keeps the math of the unshared rows:

- the prompt attends causally to itself;
- each tail attends to the prompt's keys and values and causally to its own, its queries aligned
  with the end of that key range (attention.py: `areal_kv_index` gathers each segment's keys,
  `cu_seq_lens_k` gives their boundaries);
- position ids continue after the prompt, so rotary embeddings see each tail where it was;
- the logits are kept on the rows that predict loss tokens only, the first tail token's
  predicted by the prompt's last row (`head_rows`, `head_targets`).

Gradients reach the prompt from every tail through the gathered keys and values; only the order
of the sums differs from the unshared rows. `token_index` maps the packed row back to each
sequence's own tokens (packing.unpack), so the loss sees the usual right-padded rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import packing


@dataclass
class SharedAttention:
    """The segments of a packed row with shared prompts, for the attention function."""

    cu_q: torch.Tensor  # [S + 1] int32: query segments, contiguous in the packed row
    cu_k: torch.Tensor  # [S + 1] int32: each segment's keys, in the gathered order
    kv_index: torch.Tensor  # [sum of key lengths] int64: packed positions of each segment's keys
    max_q: int
    max_k: int


def prompt_length(loss_mask_row: torch.Tensor, length: int) -> int:
    """Tokens before the first loss token of a sequence (all of them when it has none)."""
    hits = torch.nonzero(loss_mask_row[:length]).flatten()
    return int(hits[0]) if hits.numel() else length


def prompt_groups(input_ids: torch.Tensor, lengths: list[int], loss_mask: torch.Tensor) -> list[list[int]]:
    """Rows grouped by identical prompt, in first-seen order; a row whose prompt no other row has,
    or that has no loss token after a prompt of at least one token, is a group of its own."""
    groups: dict[tuple, list[int]] = {}
    for i, n in enumerate(lengths):
        p = prompt_length(loss_mask[i], n)
        key = (p, tuple(input_ids[i, :p].tolist())) if 0 < p < n else ("alone", i)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def packed_size(group: list[int], lengths: list[int], prompt: int) -> int:
    """Tokens of a group packed with its prompt once."""
    if len(group) == 1:
        return lengths[group[0]]
    return prompt + sum(lengths[i] - prompt for i in group)


def split_to_budget(group: list[int], lengths: list[int], prompt: int, budget: int) -> list[list[int]]:
    """A group cut into runs that fit `budget` tokens packed (each run repeats the prompt); a
    sequence is never split, so a run of one may exceed it."""
    runs, run = [], []
    for i in group:
        if run and packed_size(run + [i], lengths, prompt) > budget:
            runs.append(run)
            run = []
        run.append(i)
    return runs + [run]


def allocate(
    input_ids: torch.Tensor, lengths: list[int], loss_mask: torch.Tensor, budget: int, min_count: int = 1
) -> list[list[list[int]]]:
    """Micro-batches as lists of prompt groups (lists of rows), within `budget` packed tokens each
    (first-fit decreasing over the groups: packing.allocate), at least `min_count` of them."""
    items: list[list[int]] = []
    for group in prompt_groups(input_ids, lengths, loss_mask):
        prompt = prompt_length(loss_mask[group[0]], lengths[group[0]])
        items += split_to_budget(group, lengths, prompt, budget) if len(group) > 1 else [group]
    sizes = [packed_size(g, lengths, prompt_length(loss_mask[g[0]], lengths[g[0]])) for g in items]
    bins = packing.allocate(sizes, budget, min_count=min_count)
    return [[items[k] for k in b] for b in bins]


def pack(
    input_ids: torch.Tensor, lengths: list[int], loss_mask: torch.Tensor, groups: list[list[int]], pad_id: int = 0
) -> packing.PackedMicroBatch:
    """One packed row of prompt groups (a dummy token when there are none): each group's prompt
    once, then each row's tail; rows of one-row groups packed whole (a row of no shared prompt at
    all is packing.pack's)."""
    if all(len(g) == 1 for g in groups):  # nothing shared (multi-turn rows, a dummy): the plain row
        rows = [g[0] for g in groups]
        return packing.pack(input_ids, lengths, rows, pad_id, loss_mask if rows else None)
    ids, pos, q_lens, kv_parts, token_parts = [], [], [], [], []
    rows, targets, indices = [], [], []
    at = 0  # packed position of the next token
    for group in groups:
        n0 = lengths[group[0]]
        prompt = prompt_length(loss_mask[group[0]], n0) if len(group) > 1 else 0
        start = at
        if prompt:
            ids.append(input_ids[group[0], :prompt])
            pos.append(torch.arange(prompt))
            q_lens.append(prompt)
            kv_parts.append(torch.arange(start, start + prompt))
            at += prompt
        for i in group:
            n = lengths[i]
            tail = n - prompt
            ids.append(input_ids[i, prompt:n])
            pos.append(torch.arange(prompt, n))
            q_lens.append(tail)
            kv_parts.append(torch.cat([torch.arange(start, start + prompt), torch.arange(at, at + tail)]))
            token_parts.append(torch.cat([torch.arange(start, start + prompt), torch.arange(at, at + tail)]))
            # next-token rows: token t of the row (t >= 1) is predicted by the packed row of token t - 1
            where = token_parts[-1]
            keep = torch.nonzero(loss_mask[i, 1:n]).flatten() + 1
            rows.append(where[keep - 1])
            targets.append(where[keep])
            indices.append(i)
            at += tail
    ids_row = torch.cat(ids).to(input_ids.dtype)[None]
    k_lens = [len(k) for k in kv_parts]
    shared = SharedAttention(
        cu_q=torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32),
        cu_k=torch.tensor([0, *k_lens]).cumsum(0).to(torch.int32),
        kv_index=torch.cat(kv_parts),
        max_q=max(q_lens),
        max_k=max(k_lens),
    )
    head_rows, head_targets = torch.cat(rows), torch.cat(targets)
    if not head_rows.numel():  # no loss token: one row all the same, a graph for backward
        head_rows, head_targets = torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.long)
    return packing.PackedMicroBatch(
        indices,
        [lengths[i] for i in indices],
        ids_row,
        torch.cat(pos)[None],
        head_rows=head_rows,
        head_targets=head_targets,
        token_index=torch.cat(token_parts),
        shared=shared,
    )
