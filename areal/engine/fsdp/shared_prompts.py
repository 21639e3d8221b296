"""actor.share_prompts: a prompt that several sequences of a micro-batch start with is computed once.

GRPO samples n answers per prompt, and the trainer forwarded and back-propagated each prompt n
times: at the 0.5B benchmark shape (235-token prompts, 192 generated tokens, n = 8) 48% of the
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


def prompt_lengths(loss_mask: torch.Tensor, lengths: list[int]) -> list[int]:
    """Tokens before the first loss token of each sequence (all of them where it has none)."""
    has = loss_mask.bool().any(1)
    first = loss_mask.bool().int().argmax(1)  # the first 1 of each row (argmax gives the first maximum)
    return [int(f) if h else n for f, h, n in zip(first.tolist(), has.tolist(), lengths)]


def prompt_groups(input_ids: torch.Tensor, lengths: list[int], prompts: list[int]) -> list[list[int]]:
    """Rows grouped by identical prompt (prompts: prompt_lengths), in first-seen order; a row whose
    prompt no other row has, or that has no loss token after a prompt of at least one token, is a
    group of its own."""
    groups: dict[tuple, list[int]] = {}
    for i, (n, p) in enumerate(zip(lengths, prompts)):
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
    runs, run, size = [], [], prompt
    for i in group:
        tail = lengths[i] - prompt
        if run and size + tail > budget:
            runs.append(run)
            run, size = [], prompt
        run.append(i)
        size += tail
    return runs + [run]


def allocate(
    input_ids: torch.Tensor, lengths: list[int], prompts: list[int], budget: int, min_count: int = 1
) -> list[list[list[int]]]:
    """Micro-batches as lists of prompt groups (lists of rows; prompts: prompt_lengths), within
    `budget` packed tokens each (first-fit decreasing over the groups: packing.allocate), at least
    `min_count` of them."""
    items: list[list[int]] = []
    for group in prompt_groups(input_ids, lengths, prompts):
        items += split_to_budget(group, lengths, prompts[group[0]], budget) if len(group) > 1 else [group]
    sizes = [packed_size(g, lengths, prompts[g[0]]) for g in items]
    bins = packing.allocate(sizes, budget, min_count=min_count)
    return [[items[k] for k in b] for b in bins]


def pack(
    input_ids: torch.Tensor,
    lengths: list[int],
    prompts: list[int],
    loss_mask: torch.Tensor,
    groups: list[list[int]],
    pad_id: int = 0,
) -> packing.PackedMicroBatch:
    """One packed row of prompt groups (a dummy token when there are none): each group's prompt
    once, then each row's tail; rows of one-row groups packed whole (a row of no shared prompt at
    all is packing.pack's). input_ids and loss_mask on the CPU; prompts: prompt_lengths of every
    row. Built with whole-row tensor operations: 11 ms for 512 rows on 2 cores, where a loop over
    the rows with a few tensor calls each took 25 ms."""
    if all(len(g) == 1 for g in groups):  # nothing shared (multi-turn rows, a dummy): the plain row
        rows = [g[0] for g in groups]
        return packing.pack(input_ids, lengths, rows, pad_id, loss_mask if rows else None)
    indices, row_prompt, row_start, row_tail = [], [], [], []
    q_lens, key_from, key_len = [], [], []  # query segments; key ranges (from, length), two per tail
    at = 0  # packed position of the next token
    for group in groups:
        prompt = prompts[group[0]] if len(group) > 1 else 0
        start = at
        if prompt:
            q_lens.append(prompt)
            key_from += [start, 0]
            key_len += [prompt, 0]
            at += prompt
        for i in group:
            tail = lengths[i] - prompt
            indices.append(i)
            row_prompt.append(prompt)
            row_start.append(start)
            row_tail.append(at)
            q_lens.append(tail)
            key_from += [start, at]  # a tail's keys: its prompt's, then its own
            key_len += [prompt, tail]
            at += tail
    n = torch.tensor([lengths[i] for i in indices])
    row = torch.repeat_interleave(torch.arange(len(indices)), n)  # each sequence token's row
    t = torch.arange(int(n.sum())) - torch.repeat_interleave(n.cumsum(0) - n, n)  # its place in the row
    p, s0, a0 = (torch.tensor(v)[row] for v in (row_prompt, row_start, row_tail))
    token_index = torch.where(t < p, s0 + t, a0 + t - p)  # where each sequence token sits in the row
    source = torch.tensor(indices)[row]
    ids_row = torch.empty(at, dtype=input_ids.dtype).index_put_((token_index,), input_ids[source, t])
    pos_row = torch.empty(at, dtype=torch.long).index_put_((token_index,), t)
    # next-token rows: token t (t >= 1) of a sequence is predicted by the packed row of its token t - 1
    keep = torch.nonzero(loss_mask[source, t].bool() & (t >= 1)).flatten()
    head_rows, head_targets = token_index[keep - 1], token_index[keep]
    if not head_rows.numel():  # no loss token: one row all the same, a graph for backward
        head_rows, head_targets = torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.long)
    k_lens = [a + b for a, b in zip(key_len[::2], key_len[1::2])]
    shared = SharedAttention(
        cu_q=torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32),
        cu_k=torch.tensor([0, *k_lens]).cumsum(0).to(torch.int32),
        kv_index=_ranges(key_from, key_len),
        max_q=max(q_lens),
        max_k=max(k_lens),
    )
    return packing.PackedMicroBatch(
        indices,
        [lengths[i] for i in indices],
        ids_row[None],
        pos_row[None],
        head_rows=head_rows,
        head_targets=head_targets,
        token_index=token_index,
        shared=shared,
    )


def _ranges(starts: list[int], counts: list[int]) -> torch.Tensor:
    """The integer ranges [start, start + count) one after another, as one int64 tensor."""
    counts_t = torch.tensor(counts)
    base = torch.repeat_interleave(torch.tensor(starts), counts_t)
    offsets = torch.arange(int(counts_t.sum())) - torch.repeat_interleave(counts_t.cumsum(0) - counts_t, counts_t)
    return base + offsets
