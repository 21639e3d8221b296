"""Chunked token log-probabilities equal log_softmax + gather, in value and in gradient."""

import pytest
import torch

from areal.engine.fsdp.logprobs import token_logprobs_and_entropy


def reference(logits, targets, temperature):
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    lp = logp.gather(-1, targets[:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_log_softmax_in_value_and_gradient(dtype, temperature):
    torch.manual_seed(0)
    n, vocab = 37, 101  # chunk=8 leaves a short last chunk
    base = (torch.randn(n, vocab) * 3).to(dtype)
    targets = torch.randint(0, vocab, (n,))
    weights = torch.randn(n)

    mine = base.clone().requires_grad_(True)
    lp, ent = token_logprobs_and_entropy(mine, targets, temperature=temperature, chunk=8)
    (lp * weights).sum().backward()

    ref = base.clone().requires_grad_(True)
    ref_lp, ref_ent = reference(ref, targets, temperature)
    (ref_lp * weights).sum().backward()

    assert torch.equal(mine.detach(), base)  # backward leaves the logits as they were
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-4, rtol=1e-4)
    assert mine.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(mine.grad.float(), ref.grad.float(), atol=tol, rtol=tol)


def test_entropy_is_optional_and_carries_no_gradient():
    logits = torch.randn(5, 11, requires_grad=True)
    lp, ent = token_logprobs_and_entropy(logits, torch.zeros(5, dtype=torch.long), with_entropy=False)
    assert ent is None and lp.requires_grad
    _, ent = token_logprobs_and_entropy(logits, torch.zeros(5, dtype=torch.long))
    assert not ent.requires_grad


@pytest.mark.slow
def test_compiled_kernels_match_eager_over_row_counts():
    """actor.compile_logprobs: the fused kernels give the eager path's logprobs, entropy and bf16
    gradient, for micro-batches of different lengths (dynamic rows: no recompile per length)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    vocab = 1000
    for n in (37, 64, 23):
        base = (torch.randn(n, vocab) * 3).to(torch.bfloat16)
        targets = torch.randint(0, vocab, (n,))
        weights = torch.randn(n)
        runs = []
        for compiled in (False, True):
            logits = base.clone().requires_grad_(True)
            lp, ent = token_logprobs_and_entropy(logits, targets, temperature=0.7, compiled=compiled)
            (lp * weights).sum().backward()
            runs.append((lp, ent, logits.grad))
        (lp_e, ent_e, grad_e), (lp_c, ent_c, grad_c) = runs
        torch.testing.assert_close(lp_c, lp_e, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent_c, ent_e, atol=1e-4, rtol=1e-4)
        assert grad_c.dtype == torch.bfloat16
        torch.testing.assert_close(grad_c.float(), grad_e.float(), atol=1e-2, rtol=1e-2)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 2  # one forward and one gradient graph serve every row count
