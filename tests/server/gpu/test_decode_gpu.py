"""The built-in server's decode step on CUDA (skipped without it; run through the device tool):
grouped-query decode attention runs SDPA's CUDA kernels with a broadcast padding mask, which the
CPU tests do not reach. Logits after many in-place decode steps, with left-padded rows, must match
a full forward pass of each sequence alone."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-3), ("bfloat16", 0.15)])
def test_cuda_decode_matches_full_forward(dtype, tol, tmp_path):
    from transformers import AutoModelForCausalLM

    from areal.server.attention import ATTN_IMPLEMENTATION
    from areal.server.engine import ModelRunner
    from tests.serving import make_varied_model_dir

    model_dir = str(make_varied_model_dir(tmp_path / "model", num_heads=8, num_kv_heads=2))
    runner = ModelRunner(model_dir, dtype=dtype, device="cuda")
    assert runner.model.config._attn_implementation == ATTN_IMPLEMENTATION
    prompts = [[3, 9, 4, 7, 1, 5, 5], [5, 2], [8, 1, 1, 4]]
    batch, logits = runner.prefill(prompts)
    seqs = [list(p) for p in prompts]
    for _ in range(70):  # crosses a reallocation of the cache (64 spare columns)
        tokens = logits.argmax(-1).tolist()
        for seq, tok in zip(seqs, tokens):
            seq.append(tok)
        logits = runner.decode(batch, tokens)
    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).cuda().eval()
    worst = 0.0
    for row, seq in enumerate(seqs):
        with torch.no_grad():
            ref = ref_model(torch.tensor([seq], device="cuda")).logits[0, -1].float()
        worst = max(worst, (logits[row].float() - ref).abs().max().item() / ref.abs().max().item())
    print(f"{dtype}: max relative logit gap after 70 decode steps {worst:.2e}")
    assert worst < tol
