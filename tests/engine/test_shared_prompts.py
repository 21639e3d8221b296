"""actor.share_prompts: a prompt packed once for the sequences that start with it gives the logprobs,
the loss, the gradient and the update of the unshared sequences, on fewer computed tokens."""

import pytest
import torch

from areal.engine.fsdp import packing, shared_prompts
from tests.engine.test_fsdp_helpers import nll_loss, one_torch_thread, padded_logprobs, token_weight
from tests.engine.test_fsdp_helpers import one_rank_engine as _engine


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def grpo_batch(
    seed: int, prompts: int = 3, answers: int = 4, max_prompt: int = 7, max_answer: int = 6, lone_row: bool = True
):
    """A right-padded GRPO-like batch: `answers` sequences per prompt, each group's rows adjacent,
    prompts and answers of varied lengths, loss on the answers; one extra row alone (lone_row)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(prompts):
        prompt = torch.randint(3, 40, (int(torch.randint(2, max_prompt + 1, (1,), generator=g)),), generator=g)
        for _ in range(answers):
            answer = torch.randint(3, 40, (int(torch.randint(1, max_answer + 1, (1,), generator=g)),), generator=g)
            rows.append((prompt, answer))
    if lone_row:
        rows.append((torch.randint(3, 40, (4,), generator=g), torch.randint(3, 40, (3,), generator=g)))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn, loss = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (p, a) in enumerate(rows):
        n = len(p) + len(a)
        ids[i, :n] = torch.cat([p, a])
        attn[i, :n] = 1
        loss[i, len(p) : n] = 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def test_groups_are_the_rows_of_one_prompt():
    batch = grpo_batch(0)
    lengths = packing.sequence_lengths(batch["attention_mask"])
    prompts = shared_prompts.prompt_lengths(batch["loss_mask"], lengths)
    groups = shared_prompts.prompt_groups(batch["input_ids"], lengths, prompts)
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12]]


def test_a_packed_group_holds_its_prompt_once_and_maps_back_to_each_row():
    batch = grpo_batch(1, prompts=1, answers=3)
    ids, mask = batch["input_ids"], batch["loss_mask"]
    lengths = packing.sequence_lengths(batch["attention_mask"])
    p = shared_prompts.prompt_lengths(mask, lengths)[0]
    mb = shared_prompts.pack(ids, lengths, shared_prompts.prompt_lengths(mask, lengths), mask, [[0, 1, 2], [3]])
    tails = [n - p for n in lengths[:3]]
    assert mb.n_tokens == p + sum(tails) + lengths[3] < sum(lengths)
    assert mb.indices == [0, 1, 2, 3] and mb.seqlens == lengths
    back = packing.unpack(mb.input_ids[0].float(), mb, max(lengths))
    assert torch.equal(back.long(), ids[:, : max(lengths)])  # each row's tokens, its prompt repeated
    pos = packing.unpack(mb.position_ids[0].float(), mb, max(lengths)).long()
    assert torch.equal(pos, torch.arange(max(lengths)).expand_as(pos) * batch["attention_mask"][:, : max(lengths)])
    # the prompt's segment, each tail's (over prompt + tail keys), the lone row's
    assert (mb.shared.cu_q[1:] - mb.shared.cu_q[:-1]).tolist() == [p, *tails, lengths[3]]
    assert (mb.shared.cu_k[1:] - mb.shared.cu_k[:-1]).tolist() == [p, *lengths[:3], lengths[3]]
    # every loss token is predicted by the packed row of its predecessor in its own sequence
    flat = packing.unpack(torch.arange(mb.n_tokens).float(), mb, max(lengths)).long()
    want = [(flat[i, t - 1], flat[i, t]) for i in range(4) for t in range(1, lengths[i]) if mask[i, t]]
    assert list(zip(mb.head_rows.tolist(), mb.head_targets.tolist())) == [(int(a), int(b)) for a, b in want]


def test_rows_of_no_shared_prompt_pack_as_before():
    batch = grpo_batch(4, prompts=1, answers=3)
    lengths = packing.sequence_lengths(batch["attention_mask"])
    prompts = shared_prompts.prompt_lengths(batch["loss_mask"], lengths)
    mb = shared_prompts.pack(batch["input_ids"], lengths, prompts, batch["loss_mask"], [[3], [0]])
    plain = packing.pack(batch["input_ids"], lengths, [3, 0], loss_mask=batch["loss_mask"])
    assert mb.shared is None and mb.token_index is None and torch.equal(mb.input_ids, plain.input_ids)
    assert torch.equal(mb.head_rows, plain.head_rows)
    assert shared_prompts.pack(batch["input_ids"], lengths, prompts, batch["loss_mask"], []).is_dummy


def test_big_groups_split_to_the_budget_and_every_row_is_packed_once():
    batch = grpo_batch(2, prompts=2, answers=6)
    lengths = packing.sequence_lengths(batch["attention_mask"])
    prompts = shared_prompts.prompt_lengths(batch["loss_mask"], lengths)
    bins = shared_prompts.allocate(batch["input_ids"], lengths, prompts, budget=24, min_count=3)
    assert len(bins) >= 3
    rows = sorted(i for b in bins for g in b for i in g)
    assert rows == list(range(len(lengths)))
    for b in bins:
        mb = shared_prompts.pack(batch["input_ids"], lengths, prompts, batch["loss_mask"], b)
        assert mb.n_tokens <= 24 or len(b) == 1 and len(b[0]) == 1


@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused-head"])
def test_shared_prompts_train_as_unshared(tiny_model_dir, fused):
    """Forward logprobs, loss, grad norm and the update equal the unshared engine's, and the shared
    engine computes fewer tokens."""
    from transformers import AutoModelForCausalLM

    batch = grpo_batch(3)
    runs = {}
    for share in (True, False):
        engine = _engine(tiny_model_dir, fused_logprobs=fused, share_prompts=share, max_tokens_per_mb=40)
        try:
            before = engine.forward(batch)
            stats = engine.train_batch(batch, nll_loss, token_weight)
            runs[share] = (before, stats, engine.forward(batch))
        finally:
            engine.destroy()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        expected = padded_logprobs(plain, batch)
    (lp_s, st_s, after_s), (lp_u, st_u, after_u) = runs[True], runs[False]
    assert (lp_s - expected).abs().max() < 1e-5 and (lp_u - expected).abs().max() < 1e-5
    assert st_s["loss"] == pytest.approx(st_u["loss"], rel=1e-6)
    assert st_s["grad_norm"] == pytest.approx(st_u["grad_norm"], rel=1e-5)
    assert st_s["n_microbatches"] >= 2
    assert st_s["n_tokens"] < 0.8 * st_u["n_tokens"]  # the prompts computed once
    assert (after_s - after_u).abs().max() < 1e-5  # the same update
    assert (after_u - lp_u).abs().max() > 1e-3  # ...which moved the model


def test_shared_prompts_need_the_packed_attention(tiny_model_dir):
    with pytest.raises(ValueError, match=r"actor.share_prompts=true needs the engine's packed attention"):
        _engine(tiny_model_dir, share_prompts=True, attn_implementation="sdpa")
    with pytest.raises(ValueError, match=r"(?s)actor.share_prompts = True.*share_prompts to auto or false"):
        _engine(tiny_model_dir, share_prompts=True, logprobs_on_every_token=True)


@pytest.mark.parametrize(
    "settings,device,shares",
    [
        ({}, "cuda", True),  # the default, 'auto', with the engine's packed attention
        ({}, "cpu", False),  # small CPU models gain nothing
        ({"share_prompts": True}, "cpu", True),
        ({"attn": "sdpa"}, "cuda", False),
        ({"logprobs_on_every_token": True}, "cuda", False),
        ({"share_prompts": False}, "cuda", False),
    ],
    ids=["cuda", "cpu", "cpu-asked", "other-attention", "every-token", "off"],
)
def test_shared_prompts_are_on_by_default_on_cuda_where_they_apply(settings, device, shares, caplog):
    """actor.share_prompts='auto' shares on CUDA wherever the engine can, and says why not where it
    cannot."""
    from types import SimpleNamespace

    from areal.engine.fsdp.engine import _share_prompts

    settings = {"share_prompts": "auto", "logprobs_on_every_token": False, **settings}
    attn = settings.pop("attn", "areal_packed_sdpa")
    with caplog.at_level("INFO", logger="areal.fsdp"):
        assert _share_prompts(SimpleNamespace(**settings), attn, device) is shares
    said = "actor.share_prompts=auto: each sequence computed whole" in caplog.text
    assert said == (device == "cuda" and not shares and settings["share_prompts"] == "auto")


@pytest.mark.parametrize("settings,shares", [({}, False), ({"share_prompts": True}, True)], ids=["default", "asked"])
def test_a_cpu_engine_shares_prompts_when_asked(tiny_model_dir, settings, shares):
    """On CPU the default computes each sequence whole; actor.share_prompts=true computes fewer tokens."""
    batch = grpo_batch(3)
    engine = _engine(tiny_model_dir, max_tokens_per_mb=40, **settings)
    try:
        assert engine.share_prompts is shares
        stats = engine.train_batch(batch, nll_loss, token_weight)
    finally:
        engine.destroy()
    every = int(batch["attention_mask"].sum())
    assert (stats["n_tokens"] < 0.8 * every) if shares else stats["n_tokens"] == every
