"""What runs different kernels on CUDA (skipped without it; run through the device tool):

* packed attention (causal SDPA per packed sequence, flash kernels in bf16) gives the logprobs of
  one-sequence micro-batches;
* the chunked log-prob function matches log_softmax in value and gradient at a real vocabulary size.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.gpu.test_fsdp_gpu import _bench_module

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 0.1)])
def test_packed_logprobs_equal_one_sequence_microbatches(dtype, tol, tmp_path):
    from areal.engine.fsdp.engine import FSDPEngine

    bench = _bench_module()
    model_dir, tok_dir = bench.build_model_dir("tiny", tmp_path)
    batch = bench.make_batch(12, 40, 400, vocab=512)
    logp = {}
    for budget in (4096, 400):  # all sequences in one packed row / one sequence per micro-batch
        engine = FSDPEngine.from_pretrained(model_dir, tokenizer_path=tok_dir, dtype=dtype,
                                            max_tokens_per_mb=budget)
        try:
            logp[budget] = engine.forward(batch)
        finally:
            engine.destroy()
    mask = batch["attention_mask"].bool()
    gap = (logp[4096] - logp[400])[mask].abs().max().item()
    print(f"{dtype}: packed vs one-per-micro-batch max gap {gap:.2e}")
    assert gap < tol


def test_chunked_logprobs_match_log_softmax_on_cuda():
    from areal.engine.fsdp.logprobs import token_logprobs_and_entropy

    torch.manual_seed(0)
    logits = (torch.randn(3000, 151936, device="cuda") * 2).bfloat16()
    targets = torch.randint(0, 151936, (3000,), device="cuda")
    mine = logits.clone().requires_grad_(True)
    lp, _ = token_logprobs_and_entropy(mine, targets, temperature=0.9)
    lp.sum().backward()
    ref = logits.clone().requires_grad_(True)
    ref_lp = torch.log_softmax(ref.float() / 0.9, -1).gather(-1, targets[:, None]).squeeze(-1)
    ref_lp.sum().backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(mine.grad.float(), ref.grad.float(), atol=1e-2, rtol=1e-2)
