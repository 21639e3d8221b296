"""actor.max_tokens_per_mb=auto on CUDA (skipped without it; run through the device tool):

    python -m pytest -q -m gpu tests/engine/gpu/test_fsdp_mb_budget_gpu.py -s

A Qwen2.5-0.5B-shaped model (random weights, 152k vocabulary) trains with budgets measured from the
free memory: past the 4096-token probe when the device is free, and below the batch when most of
it is taken by another tenant (a tensor standing in for a colocated server), each step within the
memory that was free when it started. The CPU side: tests/engine/test_fsdp_mb_budget.py.
"""

from __future__ import annotations

import pytest
import torch
from model_shapes import make_batch

from tests.engine.gpu.conftest import nll as _nll
from tests.engine.gpu.conftest import token_weight as _weight

pytestmark = pytest.mark.gpu


def _step_within_free_memory(engine, batch):
    """One train_batch; returns its stats, the memory free when it started (as the engine counts
    it) and the peak it added above what was allocated then."""
    from areal.engine.fsdp.mb_budget import CudaMemory

    torch.cuda.synchronize()
    free = CudaMemory().free_bytes()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    stats = engine.train_batch(batch, _nll, _weight)
    torch.cuda.synchronize()
    return stats, free, torch.cuda.max_memory_allocated() - base


def test_auto_budget_measures_then_fits_the_free_memory_qwen05b_shape(qwen_05b):
    from areal.config.actor import AUTO_PROBE_TOKENS
    from areal.engine.fsdp.engine import FSDPEngine

    model_dir, tok_dir = qwen_05b
    batch = make_batch(32, 512, 1024, vocab=151936)
    tokens = int(batch["attention_mask"].sum())
    engine = FSDPEngine.from_pretrained(
        model_dir, tokenizer_path=tok_dir, dtype="bfloat16", learning_rate=1e-5, max_tokens_per_mb="auto"
    )
    hog = None
    try:
        budget = engine.mb_budget
        assert budget.measured and budget.headroom == 0.1
        engine.forward(batch)
        probe = engine.train_batch(batch, _nll, _weight)
        probe_estimate = budget.estimates["train"]

        engine.forward(batch)  # the measured forward budget
        stats, free_step, peak = _step_within_free_memory(engine, batch)
        estimate = budget.estimates["train"]

        # another tenant takes all but the room for about half the batch
        room = estimate.bytes_per_token * tokens / 2 / (1 - budget.headroom)
        take = budget.memory.free_bytes() - int(room)
        assert take > 0, "the device has less free memory than half this batch needs"
        hog = torch.empty(take, dtype=torch.uint8, device="cuda")
        tight, free_tight, peak_tight = _step_within_free_memory(engine, batch)
    finally:
        del hog
        engine.destroy()
        torch.cuda.empty_cache()
    print(
        f"auto budget: probe {probe['mb_token_budget']:.0f} ({probe['n_microbatches']:.0f} mbs, "
        f"{probe_estimate.bytes_per_token / 2**10:.0f} KiB/token at {probe_estimate.tokens} tokens); "
        f"free device {stats['mb_token_budget']:.0f} ({stats['n_microbatches']:.0f} mbs, "
        f"{estimate.bytes_per_token / 2**10:.0f} KiB/token at {estimate.tokens}; forward "
        f"{stats['mb_token_budget_forward']:.0f}), step peak {peak / 2**30:.1f} of {free_step / 2**30:.1f} GiB free; "
        f"tenant-held device {tight['mb_token_budget']:.0f} ({tight['n_microbatches']:.0f} mbs), "
        f"step peak {peak_tight / 2**30:.1f} of {free_tight / 2**30:.1f} GiB free; batch {tokens} tokens"
    )
    assert probe["mb_token_budget"] == probe["mb_token_budget_forward"] == AUTO_PROBE_TOKENS
    assert probe["n_microbatches"] >= 2
    # the free device: budgets past the probe, fewer micro-batches, and a step within the memory
    assert stats["mb_token_budget"] > AUTO_PROBE_TOKENS and stats["mb_token_budget"] % 1024 == 0
    assert stats["mb_token_budget_forward"] > AUTO_PROBE_TOKENS
    assert stats["n_microbatches"] < probe["n_microbatches"]
    assert estimate.tokens > probe_estimate.tokens  # measured again at its larger micro-batch
    assert estimate.added_bytes <= free_step * (1 - budget.headroom)  # the pass kept the headroom
    assert peak <= free_step
    # the tenant: a budget near half the batch, and the step still fits what was left
    assert tight["mb_token_budget"] < tokens and tight["n_microbatches"] >= 2
    assert peak_tight <= free_tight
    for s in (probe, stats, tight):
        assert torch.isfinite(torch.tensor(s["loss"])) and torch.isfinite(torch.tensor(s["grad_norm"]))


def test_free_memory_leaves_out_the_allocators_split_fragments():
    """A freed piece of a segment that still holds a live tensor is reserved but unallocated; a
    large tensor cannot use it, so the budget's free memory must not count it."""
    from areal.engine.fsdp.mb_budget import CudaMemory

    torch.cuda.empty_cache()
    whole = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    del whole  # a 512 MiB segment, cached
    kept = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")  # split from it
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    split = stats["inactive_split_bytes.all.current"]
    device_free, _ = torch.cuda.mem_get_info()
    cached = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    print(f"split fragments {split / 2**20:.0f} MiB, cached unallocated {cached / 2**20:.0f} MiB")
    assert split >= 400 * 2**20
    assert CudaMemory().free_bytes() == device_free + max(cached - split, 0)
    del kept
