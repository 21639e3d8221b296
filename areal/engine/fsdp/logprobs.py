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


def chunk_logprobs(z: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """(log-partition, log p(targets), entropy or None) of one chunk of fp32 rows z (logits / T)."""
    lse = torch.logsumexp(z, dim=-1)
    lp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    # H = lse - sum(p * z), the sum as one row-wise dot product
    ent = lse - torch.linalg.vecdot(torch.softmax(z, dim=-1), z) if with_entropy else None
    return lse, lp, ent


def logits_grad_(z: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient of logits / T from g = d loss / d logprob / T per row: (onehot - softmax) * g,
    written over z (fp32 rows, logits / T, a copy the caller no longer needs)."""
    out = z.sub_(lse[:, None]).exp_().mul_(-g[:, None])  # -softmax * g
    return out.scatter_add_(-1, targets[:, None], g[:, None])  # + onehot * g


def scaled(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits / T, always a new tensor (logits_grad_ overwrites it)."""
    return z.to(torch.float32, copy=True) if temperature == 1.0 else z.float() / temperature


def joined(parts: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return torch.cat(parts) if parts else like.new_zeros(0, dtype=torch.float32)


class _TokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature: float, with_entropy: bool, chunk: int):
        lse_parts, lp_parts, ent_parts = [], [], []
        for rows, tgt in zip(logits.split(chunk), targets.split(chunk)):
            lse, lp, ent = chunk_logprobs(scaled(rows, temperature), tgt, with_entropy)
            lse_parts.append(lse)
            lp_parts.append(lp)
            if with_entropy:
                ent_parts.append(ent)
        lse = joined(lse_parts, logits)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ent = torch.cat(ent_parts) if with_entropy else lse.new_zeros(0)
        ctx.mark_non_differentiable(ent)
        return joined(lp_parts, logits), ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        logits, targets, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], chunk):
            end = start + chunk
            z = scaled(logits[start:end], t)
            grad[start:end] = logits_grad_(z, lse[start:end], targets[start:end], grad_lp[start:end] / t)
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
