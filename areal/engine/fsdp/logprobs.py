"""Per-token log-probabilities (and entropy) from [T, V] logits without fp32 [T, V] copies.

`log_softmax(logits.float())` keeps an fp32 copy of the logits and an fp32 [T, V] output for
backward: for a 150k vocabulary and a 16k-token micro-batch that is 2 x 10 GB written, stored and
read again, more than the logits themselves. This autograd function walks the rows in chunks,
upcasting one chunk at a time, and keeps only the (bf16) logits and the per-row log-partition
for backward, where the gradient (onehot - softmax) / temperature is rebuilt chunk by chunk.
"""

from __future__ import annotations

import torch

CHUNK_ROWS = 2048


class _TokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature: float, with_entropy: bool, chunk: int):
        lse_parts, lp_parts, ent_parts = [], [], []
        for rows, tgt in zip(logits.split(chunk), targets.split(chunk)):
            z = rows.float() if temperature == 1.0 else rows.float() / temperature
            lse = torch.logsumexp(z, dim=-1)
            lse_parts.append(lse)
            lp_parts.append(z.gather(-1, tgt[:, None]).squeeze(-1) - lse)
            if with_entropy:  # H = lse - sum(p * z), the sum as one row-wise dot product
                ent_parts.append(lse - torch.linalg.vecdot(torch.softmax(z, dim=-1), z))
        lse = torch.cat(lse_parts)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ent = torch.cat(ent_parts) if with_entropy else lse.new_zeros(0)
        ctx.mark_non_differentiable(ent)
        return torch.cat(lp_parts), ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        logits, targets, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], chunk):
            end = start + chunk
            rows = logits[start:end]  # z must be a copy: it is overwritten below
            z = rows.to(torch.float32, copy=True) if t == 1.0 else rows.float() / t
            g = grad_lp[start:end, None] / t
            out = z.sub_(lse[start:end, None]).exp_().mul_(-g)  # -softmax * g / T, in z's memory
            out.scatter_add_(-1, targets[start:end, None], g)  # + onehot * g / T
            grad[start:end] = out.to(grad.dtype)
        return grad, None, None, None, None


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk: int = CHUNK_ROWS,
):
    """logits [N, V] (any float dtype), targets [N] -> (log p(targets) [N] fp32, entropy [N] fp32 or None).

    Differentiable in the log-probabilities; the entropy is a statistic (no gradient).
    """
    lp, ent = _TokenLogprob.apply(logits, targets, float(temperature), with_entropy, chunk)
    return lp, (ent if with_entropy else None)
