"""Per-token log-probabilities (and entropy) from [T, V] logits without fp32 [T, V] copies.

`log_softmax(logits.float())` keeps an fp32 copy of the logits and an fp32 [T, V] output for
backward: for a 150k vocabulary and a 16k-token micro-batch that is 2 x 10 GB written, stored and
read again, more than the logits themselves. This autograd function walks the rows in chunks,
upcasting one chunk at a time, and keeps only the (bf16) logits and the per-row log-partition
for backward, where the gradient (onehot - softmax) / temperature is rebuilt chunk by chunk.

Eager, each chunk still takes several fp32 passes over [rows, V] (the upcast, the log-partition,
the softmax for the entropy; in backward the upcast, exp, scale and the bf16 cast): in a profiled
0.5B GRPO step on an H200 such element-wise kernels took more device time than the matmuls.
With `compiled=True` (actor.compile_logprobs) torch.compile fuses each direction into row-wise
reductions that read the bf16 logits and write only per-row results (forward) or the bf16
gradient (backward), so no fp32 [rows, V] buffer exists and no chunking is needed.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

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


def rows_logprobs(rows: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    """(log-partition, log p(targets), entropy or None) of logit rows of any float dtype."""
    return chunk_logprobs(scaled(rows, temperature), targets, with_entropy)


def rows_logits_grad(
    rows: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, grad_lp: torch.Tensor, temperature: float
):
    """The gradient of logit rows (in their dtype) from d loss / d log p(targets) per row."""
    return logits_grad_(scaled(rows, temperature), lse, targets, grad_lp / temperature).to(rows.dtype)


def rows_logits_grad_pointwise(
    rows: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, grad_lp: torch.Tensor, temperature: float
):
    """rows_logits_grad as one element-wise expression, the one-hot from a comparison instead of a
    scatter: torch.compile makes it a single kernel that writes the gradient in the rows' dtype and
    keeps no [rows, V] buffer of its own (eager, it would build several)."""
    g = (grad_lp / temperature)[:, None]
    p = torch.exp(rows.float() / temperature - lse[:, None])
    hit = torch.arange(rows.shape[-1], device=rows.device)[None] == targets[:, None]
    return ((hit.float() - p) * g).to(rows.dtype)


class RowKernels(NamedTuple):
    """How rows of logits become (lse, logprob, entropy) and back into their gradient."""

    forward: Callable
    grad: Callable


EAGER = RowKernels(rows_logprobs, rows_logits_grad)


@functools.cache
def compiled_kernels() -> RowKernels:
    """rows_logprobs and rows_logits_grad_pointwise under torch.compile, compiled on first use (one
    graph each for any number of rows; a new temperature or entropy setting adds one)."""
    fwd = torch.compile(rows_logprobs, dynamic=True)
    grad = torch.compile(rows_logits_grad_pointwise, dynamic=True)
    return RowKernels(fwd, grad)


def row_kernels(compiled: bool) -> RowKernels:
    return compiled_kernels() if compiled else EAGER


class _TokenLogprob(torch.autograd.Function):
    """`chunk` rows of logits at a time, or all of them at once (None: the compiled kernels keep no
    [rows, V] buffer to bound)."""

    @staticmethod
    def forward(ctx, logits, targets, temperature: float, with_entropy: bool, kernels: RowKernels, chunk: int | None):
        step = chunk or max(logits.shape[0], 1)
        lse_parts, lp_parts, ent_parts = [], [], []
        for rows, tgt in zip(logits.split(step), targets.split(step)):
            lse, lp, ent = kernels.forward(rows, tgt, temperature, with_entropy)
            lse_parts.append(lse)
            lp_parts.append(lp)
            if with_entropy:
                ent_parts.append(ent)
        lse = joined(lse_parts, logits)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.kernels, ctx.step = temperature, kernels, step
        ent = torch.cat(ent_parts) if with_entropy else lse.new_zeros(0)
        ctx.mark_non_differentiable(ent)
        return joined(lp_parts, logits), ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        logits, targets, lse = ctx.saved_tensors
        t, kernels, step = ctx.temperature, ctx.kernels, ctx.step
        if step >= logits.shape[0]:  # one piece: its gradient is the whole, no copy into a second buffer
            return kernels.grad(logits, lse, targets, grad_lp, t), None, None, None, None, None
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], step):
            end = start + step
            grad[start:end] = kernels.grad(logits[start:end], lse[start:end], targets[start:end], grad_lp[start:end], t)
        return grad, None, None, None, None, None


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    compiled: bool = False,
    chunk: int = CHUNK_ROWS,
):
    """logits [N, V] (any float dtype), targets [N] -> (log p(targets) [N] fp32, entropy [N] fp32 or None).

    Differentiable in the log-probabilities; the entropy is a statistic (no gradient). `compiled`:
    torch.compile's fused kernels (see above) instead of the eager loop over `chunk` rows at a time.
    """
    kernels = row_kernels(compiled)
    lp, ent = _TokenLogprob.apply(
        logits, targets, float(temperature), with_entropy, kernels, None if compiled else chunk
    )
    return lp, (ent if with_entropy else None)
