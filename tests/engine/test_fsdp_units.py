"""Pure pieces of the FSDP engine: packing, LR schedules, bucketing."""

import math

import pytest
import torch

from areal.engine.fsdp import packing
from areal.engine.fsdp.optim import build_optimizer, lr_multiplier
from areal.engine.fsdp.weight_sync import buckets, disk_update_path


# ---- packing ------------------------------------------------------------------------------------
def test_allocate_first_fit_decreasing_respects_budget():
    bins = packing.allocate([5, 3, 4, 2, 9], max_tokens=9)
    assert sorted(map(sorted, bins)) == [[0, 2], [1, 3], [4]]  # 9 | 5+4 | 3+2
    for b in bins:
        assert sum([5, 3, 4, 2, 9][i] for i in b) <= 9


def test_allocate_oversized_sequence_gets_own_bin():
    assert packing.allocate([20, 1], max_tokens=8) == [[0], [1]]


def test_allocate_min_count_splits_then_adds_dummies():
    bins = packing.allocate([1, 1, 1, 1], max_tokens=100, min_count=3)
    assert len(bins) == 3 and sorted(i for b in bins for i in b) == [0, 1, 2, 3]
    bins = packing.allocate([1], max_tokens=100, min_count=3)
    assert bins == [[0], [], []]


def test_pack_and_unpack_round_trip():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]])
    lengths = packing.sequence_lengths((ids > 0).long())
    assert lengths == [3, 2, 4]
    mb = packing.pack(ids, lengths, [0, 1])
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert packing.unpack(mb.input_ids[0], mb, 4).tolist() == [[5, 6, 7, 0], [8, 9, 0, 0]]
    assert packing.pack(ids, lengths, []).is_dummy


def test_head_rows_are_the_predecessors_of_loss_tokens():
    """pack(..., loss_mask) keeps the rows t whose next token t + 1 carries loss: never the row
    before a sequence's first token (another sequence's last), at least one row, none for one token."""
    ids = torch.arange(1, 13).view(2, 6)
    lengths = [6, 4]
    loss_mask = torch.tensor([[0, 0, 1, 1, 0, 1], [1, 0, 1, 1, 0, 0]])  # a loss flag on a first token, too
    mb = packing.pack(ids, lengths, [0, 1], loss_mask=loss_mask)
    assert mb.head_rows.tolist() == [1, 2, 4, 7, 8]  # row 5 (seq 0's last) would predict seq 1's first
    lp, _ = packing.scatter_to_tokens(torch.tensor([-1.0, -2, -3, -4, -5]), None, mb.head_rows + 1, mb.n_tokens)
    assert lp.tolist() == [0, 0, -1, -2, 0, -3, 0, 0, -4, -5]
    prompts_only = packing.pack(ids, lengths, [1], loss_mask=torch.zeros_like(loss_mask))
    assert prompts_only.head_rows.tolist() == [0]  # a graph for backward all the same
    assert packing.pack(ids, [1, 4], [0], loss_mask=loss_mask).head_rows is None
    assert packing.pack(ids, lengths, [0, 1]).head_rows is None  # no loss_mask: every token


def test_left_padding_rejected():
    with pytest.raises(ValueError, match="right-padded"):
        packing.sequence_lengths(torch.tensor([[0, 1, 1]]))


def test_block_causal_mask():
    m = packing.block_causal_mask([2, 1], device="cpu")[0, 0]
    assert m.tolist() == [[True, False, False], [True, True, False], [False, False, True]]
    f = packing.block_causal_mask([2, 1], device="cpu", dtype=torch.float32)[0, 0]
    assert f[0, 0] == 0 and f[2, 0] == torch.finfo(torch.float32).min


def _row_logprobs(logits, ids, seqlens, temperature=1.0):
    """Per-token figures of a packed row as the engine computes them over every row."""
    from areal.engine.fsdp.logprobs import token_logprobs_and_entropy

    lp, ent = token_logprobs_and_entropy(logits[:-1], ids[1:], temperature=temperature)
    return packing.align_to_tokens(lp, ent, seqlens)


def test_token_logprobs_by_hand():
    # two packed sequences [a, b] and [c, d]; vocab 2; logits chosen so log-softmax is simple
    logits = torch.tensor([[0.0, 0.0], [math.log(3), 0.0], [5.0, 5.0], [0.0, math.log(3)]])
    ids = torch.tensor([0, 1, 1, 0])
    lp, ent = _row_logprobs(logits, ids, [2, 2])
    # position 1 predicted by uniform logits[0]: log .5; position 3 by logits[2] (uniform): log .5
    assert torch.allclose(lp, torch.tensor([0.0, math.log(0.5), 0.0, math.log(0.5)]))
    assert torch.allclose(ent, torch.tensor([0.0, math.log(2), 0.0, math.log(2)]))
    lp2, _ = _row_logprobs(logits, ids, [4], temperature=2.0)
    # position 2 (token 1) predicted by logits[1] / 2 = [log 3 / 2, 0] -> p(1) = 1 / (1 + sqrt 3)
    assert lp2[2].item() == pytest.approx(math.log(1 / (1 + math.sqrt(3))))


# ---- schedules ----------------------------------------------------------------------------------
def _opt(**kw):
    from areal.config.actor import OptimizerConfig

    return OptimizerConfig(**kw)


def test_constant_with_warmup():
    f = lr_multiplier(_opt(warmup_steps_proportion=0.5), 4)  # 2 warmup steps
    assert [f(s) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]


def test_linear_and_cosine_decay_to_min():
    lin = lr_multiplier(_opt(lr_scheduler_type="linear", min_lr_ratio=0.1), 4)
    assert [round(lin(s), 6) for s in range(5)] == [1.0, 0.775, 0.55, 0.325, 0.1]
    cos = lr_multiplier(_opt(lr_scheduler_type="cosine"), 4)
    assert [round(cos(s), 6) for s in range(5)] == [
        1.0,
        round(0.5 * (1 + math.cos(math.pi / 4)), 6),
        0.5,
        round(0.5 * (1 + math.cos(3 * math.pi / 4)), 6),
        0.0,
    ]


def test_schedule_needs_total_steps():
    with pytest.raises(ValueError, match="total_train_steps"):
        lr_multiplier(_opt(lr_scheduler_type="cosine"), None)
    assert lr_multiplier(_opt(), None)(10) == 1.0


# ---- weight sync helpers ------------------------------------------------------------------------
def test_cpu_optimizer_is_the_fused_adamw_and_matches_the_reference_loop():
    from areal.config.actor import OptimizerConfig

    cfg = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    torch.manual_seed(0)
    fused_params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    loop_params = [torch.nn.Parameter(p.detach().clone()) for p in fused_params]
    start = [p.detach().clone() for p in fused_params]
    fused = build_optimizer(fused_params, cfg)
    loop = torch.optim.AdamW(
        loop_params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=False
    )
    assert fused.defaults["fused"] is True
    for _ in range(3):
        for params, opt in ((fused_params, fused), (loop_params, loop)):
            opt.zero_grad()
            sum((p**2).sum() for p in params).backward()
            opt.step()
    for a, b, a0 in zip(fused_params, loop_params, start):
        assert (a - a0).abs().min() > 1e-3  # three steps of lr 1e-2 moved every entry
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_buckets_group_by_bytes():
    t = [("a", torch.zeros(2)), ("b", torch.zeros(2)), ("c", torch.zeros(8)), ("d", torch.zeros(1))]
    names = [[n for n, _ in b] for b in buckets(iter(t), bucket_bytes=16)]  # float32: 8, 8, 32, 4 bytes
    assert names == [["a", "b"], ["c"], ["d"]]


def test_disk_update_path():
    assert disk_update_path("/r", "exp", "t1", 3) == "/r/exp/t1/weight_update/v3"


def test_prune_disk_updates_keeps_the_two_newest_versions(tmp_path):
    from areal.engine.fsdp.weight_sync import prune_disk_updates

    for name in ("v1", "v2", "v9", "v10", "v11", "vx", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "v3").write_text("a file, not an update folder")
    deleted = prune_disk_updates(tmp_path, newest=11)
    assert sorted(p.name for p in deleted) == ["v1", "v2", "v9"]  # numeric order: v10 > v9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "v10", "v11", "v3", "vx"]
