"""FSDPEngine in one process (a one-rank gloo group): packing equivalence, LoRA, gradient
checkpointing, the PPO loss end to end and construction errors. Recovery checkpoints of the
engine are tested in tests/trainer/test_checkpoint.py."""

import pytest
import torch

from tests.engine.test_fsdp_helpers import make_batch, nll_loss, one_torch_thread, padded_logprobs, token_weight
from tests.engine.test_fsdp_helpers import one_rank_engine as _engine


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.mark.parametrize("attn", [None, "sdpa", "eager"])  # None: the default, areal_packed_sdpa
def test_packed_logprobs_equal_unpacked(tiny_model_dir, attn):
    from transformers import AutoModelForCausalLM

    batch = make_batch(7)
    engine = _engine(tiny_model_dir, attn_implementation=attn)
    try:
        assert engine.attn_implementation == (attn or "areal_packed_sdpa")
        packed, entropy = engine.forward(batch, with_entropy=True)
        assert len(engine._microbatches(batch)) >= 3  # several sequences share each packed row
    finally:
        engine.destroy()
    plain = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=attn or "sdpa"
    )
    with torch.no_grad():
        expected = padded_logprobs(plain, batch)
    assert (packed - expected).abs().max() < 1e-5  # on the loss tokens; 0 on prompts and padding
    assert (packed[batch["loss_mask"] == 1] != 0).all() and (packed[batch["loss_mask"] == 0] == 0).all()
    assert (entropy[batch["loss_mask"] == 1] > 0).all()


@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused-head"])
def test_logprobs_on_loss_tokens_only_train_as_on_every_token(tiny_model_dir, fused):
    """By default the lm_head runs only on the rows that predict loss tokens (logits_to_keep): the
    loss, the gradient and the update equal those of actor.logprobs_on_every_token=true, which
    gives every real token its logprob (prompts included), and a batch without a loss_mask gets
    every token's either way."""
    from transformers import AutoModelForCausalLM

    batch = make_batch(5)
    no_mask = {k: v for k, v in batch.items() if k != "loss_mask"}
    runs = {}
    for every in (False, True):
        engine = _engine(tiny_model_dir, fused_logprobs=fused, logprobs_on_every_token=every)
        try:
            assert engine.loss_rows_only == (not every)
            mbs = engine._microbatches(batch, "train")
            assert all((mb.head_rows is None) == every for mb in mbs)
            before, unmasked = engine.forward(batch), engine.forward(no_mask)
            stats = engine.train_batch(batch, nll_loss, token_weight)
            runs[every] = (before, unmasked, stats, engine.forward(batch))
        finally:
            engine.destroy()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        expected = padded_logprobs(plain, batch), padded_logprobs(plain, batch, every_token=True)
    (lp_loss, unmasked_loss, st_loss, after_loss), (lp_all, unmasked_all, st_all, after_all) = runs[False], runs[True]
    assert (lp_loss - expected[0]).abs().max() < 1e-5 and (lp_all - expected[1]).abs().max() < 1e-5
    assert (unmasked_loss - expected[1]).abs().max() < 1e-5 and (unmasked_all - expected[1]).abs().max() < 1e-5
    assert st_loss["loss"] == pytest.approx(st_all["loss"], rel=1e-6)
    assert st_loss["grad_norm"] == pytest.approx(st_all["grad_norm"], rel=1e-5)
    assert st_loss["n_microbatches"] >= 2
    mask = batch["loss_mask"].bool()
    assert (after_loss[mask] - after_all[mask]).abs().max() < 1e-5  # the same update
    assert (after_all[mask] - lp_all[mask]).abs().max() > 1e-3  # ...which moved the model


def test_temperature_scales_logits(tiny_model_dir):
    batch = make_batch(1, n=2)
    engine = _engine(tiny_model_dir)
    try:
        hot, cold = engine.forward(batch, temperature=2.0), engine.forward(batch, temperature=0.5)
    finally:
        engine.destroy()
    mask = batch["attention_mask"].bool()
    mask[:, 0] = False
    assert hot[mask].mean() > cold[mask].mean()  # flatter distribution: less confident per token


def test_gradient_checkpointing_gives_same_step(tiny_model_dir):
    batch = make_batch(2)
    stats = []
    for ckpt in (False, True):
        engine = _engine(tiny_model_dir, gradient_checkpointing=ckpt)
        try:
            stats.append(engine.train_batch(batch, nll_loss, token_weight))
            stats[-1]["logp"] = engine.forward(batch)
        finally:
            engine.destroy()
    assert stats[0]["loss"] == pytest.approx(stats[1]["loss"], rel=1e-6)
    assert stats[0]["grad_norm"] == pytest.approx(stats[1]["grad_norm"], rel=1e-5)
    assert (stats[0]["logp"] - stats[1]["logp"]).abs().max() < 1e-5


def test_ppo_loss_trains_end_to_end(tiny_model_dir):
    """The actor loss from areal.algo through train_batch: raises logprobs of positive-advantage answers."""
    from areal.algo.actor import loss_weight_fn, ppo_loss_fn, prepare_ppo_batch
    from areal.config.actor import ActorConfig

    cfg = ActorConfig(path=tiny_model_dir, eps_clip=0.2, behav_imp_weight_cap=5.0)
    batch = make_batch(3, n=4)
    batch["rewards"] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    engine = _engine(tiny_model_dir, learning_rate=1e-2)
    try:
        batch["logprobs"] = engine.forward(batch)
        batch = prepare_ppo_batch(batch, cfg, group_size=2)
        batch["prox_logprobs"] = batch["logprobs"].clone()
        stats = engine.train_batch(batch, ppo_loss_fn(cfg), loss_weight_fn(cfg))
        after = engine.forward(batch)
    finally:
        engine.destroy()
    mask = batch["loss_mask"].bool()
    gain = ((after - batch["logprobs"]) * mask).sum(1) / mask.sum(1)
    assert gain[0] > 0 and gain[2] > 0 and gain[1] < 0 and gain[3] < 0
    assert stats["loss_fn/importance_ratio"] == pytest.approx(1.0, abs=1e-5)


def test_first_minibatch_proximal_logprobs_from_its_training_forward_give_the_same_step(tiny_model_dir):
    """actor.recompute_first_minibatch=false: the recompute pass skips the first PPO minibatch, whose
    proximal logprobs come from its own training forward at the same weights; two minibatches then
    train to the same weights as with every row recomputed, and the pass forwards half the rows."""
    from areal.algo.actor import loss_weight_fn, ppo_loss_fn, prepare_ppo_batch, proximal_minibatches, rows_to_recompute
    from areal.config.actor import ActorConfig

    results = {}
    for recompute_first in (True, False):
        cfg = ActorConfig(
            path=tiny_model_dir,
            ppo_n_minibatches=2,
            behav_imp_weight_cap=5.0,
            recompute_first_minibatch=recompute_first,
        )
        batch = make_batch(3, n=4)
        batch["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0])
        engine = _engine(tiny_model_dir, learning_rate=1e-2)
        try:
            before = engine.forward(batch)
            batch["logprobs"] = before - 0.01  # the servers' logprobs, a little off
            batch = prepare_ppo_batch(batch, cfg, group_size=2)
            recomputed = rows_to_recompute(batch, cfg)
            recomputed["prox_logprobs"] = engine.forward(recomputed)
            stats = [
                engine.train_batch(mb, ppo_loss_fn(cfg), loss_weight_fn(cfg))
                for mb in proximal_minibatches(batch, recomputed, cfg)
            ]
            results[recompute_first] = (recomputed["input_ids"].shape[0], stats, engine.forward(batch))
        finally:
            engine.destroy()
    (rows_all, stats_all, after_all), (rows_tail, stats_tail, after_tail) = results[True], results[False]
    assert (rows_all, rows_tail) == (4, 2)
    for a, b in zip(stats_all, stats_tail):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert stats_tail[0]["loss_fn/importance_ratio"] == 1.0  # its proximal logprobs are its own
    assert (after_all - after_tail).abs().max() < 1e-5
    assert (after_all - before).abs().max() > 1e-3  # the steps did move the weights


def test_loglinear_proximal_logprobs_on_current_version_tokens_give_the_recomputed_step(tiny_model_dir):
    """actor.prox_logp_method=loglinear on tokens of the trainer's own version, with the servers'
    logprobs equal to the trainer's: the first minibatch takes its own forward's, the second the
    servers' (alpha 0), both what a recompute gives, so two minibatches train to the same weights
    with no recompute pass. `metrics` recomputes and reports how far loglinear would be."""
    from areal.algo.actor import loss_weight_fn, ppo_loss_fn, prepare_ppo_batch, proximal_minibatches, rows_to_recompute
    from areal.config.actor import ActorConfig

    results = {}
    for method in ("recompute", "loglinear", "metrics"):
        cfg = ActorConfig(path=tiny_model_dir, ppo_n_minibatches=2, behav_imp_weight_cap=5.0, prox_logp_method=method)
        batch = make_batch(3, n=4)
        batch["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0])
        engine = _engine(tiny_model_dir, learning_rate=1e-2)
        try:
            before = engine.forward(batch)
            batch["logprobs"] = before.clone()
            batch["versions"] = torch.where(batch["loss_mask"].bool(), 7, -1)
            batch = prepare_ppo_batch(batch, cfg, group_size=2)
            recomputed = rows_to_recompute(batch, cfg)
            if recomputed is not None:
                recomputed["prox_logprobs"] = engine.forward(recomputed)
            stats = [
                engine.train_batch(mb, ppo_loss_fn(cfg), loss_weight_fn(cfg))
                for mb in proximal_minibatches(batch, recomputed, cfg, version=7)
            ]
            results[method] = (recomputed, stats, engine.forward(batch))
        finally:
            engine.destroy()
    (_, stats_re, after_re), (none, stats_ll, after_ll) = results["recompute"], results["loglinear"]
    assert none is None  # no recompute pass
    for a, b in zip(stats_re, stats_ll):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert [s["loss_fn/prox_alpha"] for s in stats_ll] == [1.0, 0.0]
    assert (after_re - after_ll).abs().max() < 1e-5
    assert (after_re - before).abs().max() > 1e-3  # the steps did move the weights
    _, stats_m, after_m = results["metrics"]
    assert (after_m - after_re).abs().max() < 1e-6  # metrics trains as recompute does
    assert all(s["loss_fn/prox_approx_abs_err"] < 1e-5 for s in stats_m)


def test_lora_trains_adapters_and_saves_merged_model(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    batch = make_batch(4)
    engine = _engine(tiny_model_dir, use_lora=True, lora_rank=4, lora_alpha=8, learning_rate=1e-2)
    try:
        trainable = [n for n, p in engine.model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
        engine.train_batch(batch, nll_loss, token_weight)
        engine.train_batch(batch, nll_loss, token_weight)
        logp = engine.forward(batch)
        engine.save(str(tmp_path / "merged"))
    finally:
        engine.destroy()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        assert (padded_logprobs(merged, batch) - logp).abs().max() < 1e-5
        assert (padded_logprobs(base, batch) - logp).abs().max() > 1e-4  # the adapters did learn


def test_world_size_mismatch_names_the_backend(tiny_model_dir):
    from areal.engine.fsdp.engine import FSDPEngine

    with pytest.raises(ValueError, match=r"actor.backend=fsdp:d2t1 needs 2 trainer processes"):
        FSDPEngine.from_pretrained(tiny_model_dir, dp_size=2)
    import torch.distributed as dist

    assert not dist.is_initialized()  # the failed engine removed the one-rank group it made


def test_destroy_frees_the_model_at_once(tiny_model_dir):
    """After destroy() nothing holds the model (FSDP's modules sit in reference cycles, which kept
    it until a later collection) nor the mesh of the groups it ended."""
    import weakref

    import torch.distributed as dist

    engine = _engine(tiny_model_dir)
    engine.train_batch(make_batch(0), nll_loss, token_weight)  # optimizer state, gradients
    model = weakref.ref(engine.model)
    engine.destroy()
    assert model() is None
    assert engine.mesh is None and not dist.is_initialized()


def test_untrainable_engine_refuses_to_train(tiny_model_dir):
    engine = _engine(tiny_model_dir, trainable=False)
    try:
        assert engine.optimizer is None
        with pytest.raises(RuntimeError, match="trainable=False"):
            engine.train_batch(make_batch(0), nll_loss, token_weight)
    finally:
        engine.destroy()


@pytest.mark.slow
def test_compiled_layers_give_the_same_steps(tmp_path):
    """actor.compile: the same losses, gradients and logprobs as eager, over micro-batches of
    different lengths (dynamic shapes), with gradient checkpointing on; one compiled graph per
    region serves every decoder layer."""
    from torch._dynamo.utils import counters

    from areal.models.tiny import make_tiny_model_dir

    n_layers = 4
    model_dir = str(make_tiny_model_dir(tmp_path / "model", num_layers=n_layers))
    torch._dynamo.reset()
    counters.clear()
    batches = [make_batch(2), make_batch(3, n=5)]
    runs = []
    for compiled in (False, True):
        engine = _engine(model_dir, compile=compiled, gradient_checkpointing=True)
        try:
            stats = [engine.train_batch(b, nll_loss, token_weight) for b in batches]
            runs.append((stats, engine.forward(batches[0])))
        finally:
            engine.destroy()
    (eager, eager_logp), (comp, comp_logp) = runs
    for e, c in zip(eager, comp):
        assert c["loss"] == pytest.approx(e["loss"], rel=1e-4)
        assert c["grad_norm"] == pytest.approx(e["grad_norm"], rel=1e-3)
    assert (eager_logp - comp_logp).abs().max() < 1e-4
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0  # it did compile
    assert graphs < 2 * n_layers  # shared across layers, not one set per layer
