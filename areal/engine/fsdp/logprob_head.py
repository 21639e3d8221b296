"""actor.fused_logprobs: token log-probabilities straight from the hidden states, chunk by chunk.

The plain path materialises the [T, V] logits of a micro-batch and, in backward, their gradient:
for Qwen2.5's 152k vocabulary and a 40k-token micro-batch that is 12 GB each in bf16 (logprobs.py
already avoids the fp32 copies). Here the lm_head matmul is folded into the log-probability:
each chunk of rows computes its logits, its log-partition and the target's logprob, and keeps
nothing of size V. Backward recomputes one chunk's logits at a time and turns them into the
gradients of the hidden states and of the lm_head weight. The price is one more lm_head matmul
per micro-batch (the recomputation).

`LogprobHead` takes the place of the model's lm_head module, holding the same weight parameter
(tied embeddings stay tied), so FSDP and TP see the usual module tree and gather the weight in
the model's forward as before. Set the targets with `head.predicting(...)`; the model's output
`logits` is then [1, n, 2] for n targets: the logprob of each and the entropy (a statistic,
no gradient). Outside `predicting` it is the ordinary linear layer.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from .logprobs import CHUNK_ROWS, RowKernels, joined, row_kernels


class _LinearTokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, with_entropy: bool, kernels: RowKernels, chunk: int):
        lse_parts, lp_parts, ent_parts = [], [], []
        for h, tgt in zip(hidden.split(chunk), targets.split(chunk)):
            lse, lp, ent = kernels.forward(h @ weight.t(), tgt, temperature, with_entropy)
            lse_parts.append(lse)
            lp_parts.append(lp)
            if with_entropy:
                ent_parts.append(ent)
        lse = joined(lse_parts, hidden)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.kernels, ctx.chunk = temperature, kernels, chunk
        lp = joined(lp_parts, hidden)
        ent = torch.cat(ent_parts) if with_entropy and ent_parts else lse.new_zeros(lp.shape)
        ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        hidden, weight, targets, lse = ctx.saved_tensors
        t, kernels, chunk = ctx.temperature, ctx.kernels, ctx.chunk
        grad_hidden = torch.empty_like(hidden)
        acc = torch.promote_types(weight.dtype, torch.float32)  # bf16 weights: sum the chunks in fp32
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        for start in range(0, hidden.shape[0], chunk):
            end = start + chunk
            h = hidden[start:end]
            dz = kernels.grad(h @ weight.t(), lse[start:end], targets[start:end], grad_lp[start:end], t)
            grad_hidden[start:end] = dz @ weight
            grad_weight += (dz.t() @ h).to(acc)
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None


def linear_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    compiled: bool = False,
    chunk: int = CHUNK_ROWS,
):
    """hidden [N, H], weight [V, H], targets [N] -> (log p(targets) [N] fp32, entropy [N] fp32),
    as token_logprobs_and_entropy(hidden @ weight.T, targets) computes them, without [N, V] tensors
    kept for backward. Differentiable in hidden and weight through the logprobs. `compiled`: each
    chunk's logits go through torch.compile's fused kernels (logprobs.py)."""
    kernels = row_kernels(compiled)
    return _LinearTokenLogprob.apply(hidden, weight, targets, float(temperature), with_entropy, kernels, chunk)


class LogprobHead(nn.Module):
    """The lm_head, answering log-probabilities of given targets instead of logits (see above)."""

    def __init__(self, weight: nn.Parameter, compiled: bool = False):
        super().__init__()
        self.weight = weight  # the lm_head's own parameter: shared with the embeddings when tied
        self.compiled = compiled  # actor.compile_logprobs
        self._targets: torch.Tensor | None = None
        self._temperature, self._with_entropy = 1.0, True

    @classmethod
    def replace_in(cls, model: nn.Module, compiled: bool = False) -> "LogprobHead":
        """Put a LogprobHead in place of model's output embedding layer (a bias-free Linear)."""
        head = model.get_output_embeddings()
        if not isinstance(head, nn.Linear) or head.bias is not None:
            raise ValueError(
                f"actor.fused_logprobs=true needs a bias-free nn.Linear lm_head; this model's is {head!r}. "
                "Set actor.fused_logprobs=false."
            )
        fused = cls(head.weight, compiled)
        model.set_output_embeddings(fused)
        return fused

    @contextlib.contextmanager
    def predicting(self, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = True):
        """Within: the model's output is [1, n, 2] for n targets, row t the logprob of targets[t] and
        the entropy there. Of a whole packed row (n = T - 1), targets[t] is the token at t + 1; with
        logits_to_keep the model hands over the kept rows only, one per target."""
        self._targets, self._temperature, self._with_entropy = targets, float(temperature), with_entropy
        try:
            yield
        finally:
            self._targets = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._targets is None:
            return nn.functional.linear(hidden, self.weight)
        # row t predicts targets[t]: the packed row's last token predicts nothing (all rows given),
        # or the model kept only the predicting rows (logits_to_keep: as many rows as targets)
        rows = hidden[0, : self._targets.shape[0]]
        lp, ent = linear_token_logprobs(
            rows,
            self.weight,
            self._targets,
            temperature=self._temperature,
            with_entropy=self._with_entropy,
            compiled=self.compiled,
        )
        return torch.stack([lp[None], ent[None]], dim=-1)  # a new tensor: FSDP hooks its output, not a view
