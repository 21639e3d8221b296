"""actor.share_prompts on CUDA (skipped without it; run through the device tool):

    python -m pytest -q -m gpu tests/engine/gpu/test_shared_prompts_gpu.py -s

A Qwen2.5-0.5B-shaped model in bf16, 8 prompts x 8 answers: the shared prompts go through one
variable-length flash-attention call whose key segments are longer than their query segments (a
tail over its prompt and itself), which must align its causal mask with the end of the keys. The
logprobs and one training step match the unshared engine's within bf16 noise. The CPU side, exact
in fp32: tests/engine/test_shared_prompts.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.gpu.conftest import nll as _nll
from tests.engine.gpu.conftest import token_weight as _weight
from tests.engine.test_shared_prompts import grpo_batch

pytestmark = pytest.mark.gpu


def test_shared_prompts_match_unshared_on_cuda_qwen05b_shape(qwen_05b):
    from areal.engine.fsdp import attention
    from areal.engine.fsdp.engine import FSDPEngine

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model_dir, tok_dir = qwen_05b
    batch = grpo_batch(0, prompts=8, answers=8, max_prompt=240, max_answer=190)
    runs = {}
    for share in (True, False):
        engine = FSDPEngine.from_pretrained(
            model_dir,
            tokenizer_path=tok_dir,
            dtype="bfloat16",
            learning_rate=1e-5,
            share_prompts=share,
            fused_logprobs=True,
            max_tokens_per_mb=8192,
        )
        try:
            before = engine.forward(batch)
            stats = engine.train_batch(batch, _nll, _weight)
            runs[share] = (before, stats)
        finally:
            engine.destroy()
    assert attention._VARLEN["enabled"], "the variable-length flash attention fell back to SDPA"
    (lp_s, st_s), (lp_u, st_u) = runs[True], runs[False]
    mask = batch["loss_mask"].bool()
    gap = (lp_s - lp_u)[mask].abs().float()
    print(
        f"shared vs unshared logprobs: mean |diff| {gap.mean():.4f}, max {gap.max():.4f}; loss {st_s['loss']:.5f} "
        f"vs {st_u['loss']:.5f}, grad norm {st_s['grad_norm']:.4f} vs {st_u['grad_norm']:.4f}, tokens "
        f"{st_s['n_tokens']:.0f} vs {st_u['n_tokens']:.0f}"
    )
    assert gap.mean() < 0.02 and gap.max() < 0.25
    assert st_s["loss"] == pytest.approx(st_u["loss"], rel=2e-3)
    assert st_s["grad_norm"] == pytest.approx(st_u["grad_norm"], rel=5e-2)
    assert st_s["n_tokens"] < 0.8 * st_u["n_tokens"]
