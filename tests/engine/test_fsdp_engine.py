"""FSDPEngine in one process (a one-rank gloo group): packing equivalence, LoRA, gradient
checkpointing, the PPO loss end to end, checkpoint atomicity and construction errors."""

import errno
import os
from pathlib import Path

import pytest
import torch

from tests.engine.test_fsdp_helpers import make_batch, nll_loss, padded_logprobs, token_weight


def _engine(model_dir, **kw):
    from areal.engine.fsdp.engine import FSDPEngine

    kw.setdefault("max_tokens_per_mb", 30)
    kw.setdefault("learning_rate", 1e-3)
    return FSDPEngine.from_pretrained(model_dir, dtype="float32", **kw)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    assert (packed - expected).abs().max() < 1e-5
    assert (packed[batch["attention_mask"] == 0] == 0).all()
    assert (entropy[:, 1:][batch["attention_mask"][:, 1:] == 1] > 0).all()


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


def test_checkpoint_crash_mid_save_keeps_previous(tiny_model_dir, tmp_path, monkeypatch):
    from areal.engine.fsdp import checkpoint as ck

    batch = make_batch(5)
    engine = _engine(tiny_model_dir)
    try:
        engine.train_batch(batch, nll_loss, token_weight)
        ck.save_checkpoint(engine, tmp_path, ck.TrainerState(step=1, epoch=0, dataloader_position=1))
        saved = engine.forward(batch)
        engine.train_batch(batch, nll_loss, token_weight)

        def crash(path):
            Path(path).mkdir(parents=True)
            (Path(path) / "half-written").write_text("x")
            raise RuntimeError("killed mid-save")

        monkeypatch.setattr(engine, "save_train_state", crash)
        with pytest.raises(RuntimeError, match="mid-save"):
            ck.save_checkpoint(engine, tmp_path, ck.TrainerState(step=2))
        monkeypatch.undo()
        folder, state = ck.load_latest(tmp_path)
        assert folder.name == "step_00000001" and state.dataloader_position == 1
        assert (tmp_path / "checkpoints" / "step_00000002.tmp").exists()  # debris ignored
        ck.restore_checkpoint(engine, folder)
        assert (engine.forward(batch) - saved).abs().max() == 0
        # the next save clears the debris and keeps only the last checkpoint
        ck.save_checkpoint(engine, tmp_path, ck.TrainerState(step=2), keep_last=1)
        names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
        assert names == ["latest", "step_00000002"]
    finally:
        engine.destroy()
    assert ck.load_latest(tmp_path / "nothing-here") is None


class _FillsUp:
    """A file stream on a disk that fills up after `budget` bytes (then: ENOSPC, as write(2) says)."""

    def __init__(self, stream, path, budget: int):
        self._stream, self._path, self._left = stream, str(path), budget

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        if len(data) > self._left:
            self._stream.write(data[: self._left])
            self._left = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)
        self._left -= len(data)
        return self._stream.write(data)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def test_checkpoint_disk_full_names_the_path_and_keeps_previous(tiny_model_dir, tmp_path, monkeypatch):
    """The disk fills up half-way through a checkpoint's tensor files (simulated in DCP's file
    writer): the error names the folder, the cause and the fix; the previous checkpoint restores."""
    import contextlib

    from torch.distributed.checkpoint import filesystem

    from areal.engine.fsdp import checkpoint as ck

    batch = make_batch(5)
    engine = _engine(tiny_model_dir)
    try:
        engine.train_batch(batch, nll_loss, token_weight)
        ck.save_checkpoint(engine, tmp_path, ck.TrainerState(step=2, dataloader_position=2))
        saved = engine.forward(batch)
        engine.train_batch(batch, nll_loss, token_weight)
        real = filesystem.FileSystem.create_stream

        @contextlib.contextmanager
        def full_disk(self, path, mode):
            with real(self, path, mode) as stream:
                yield _FillsUp(stream, path, budget=4096)

        monkeypatch.setattr(filesystem.FileSystem, "create_stream", full_disk)
        with pytest.raises(ck.CheckpointWriteError) as failed:
            ck.save_checkpoint(engine, tmp_path, ck.TrainerState(step=4))
        monkeypatch.undo()
        message, root = str(failed.value), tmp_path / "checkpoints"
        assert message.startswith(
            f"cannot write recovery checkpoint {root / 'step_00000004.tmp'}: "
            f"No space left on device ({root / 'step_00000004.tmp' / 'train_state'}"
        )
        assert f"The previous checkpoint is intact: {root / 'step_00000002'} (step 2)" in message
        assert "free disk space" in message and "recover.mode=auto" in message
        folder, state = ck.load_latest(tmp_path)
        assert folder.name == "step_00000002" and state.dataloader_position == 2
        ck.restore_checkpoint(engine, folder)
        assert (engine.forward(batch) - saved).abs().max() == 0
    finally:
        engine.destroy()


def test_world_size_mismatch_names_the_backend(tiny_model_dir):
    from areal.engine.fsdp.engine import FSDPEngine

    with pytest.raises(ValueError, match=r"actor.backend=fsdp:d2t1 needs 2 trainer processes"):
        FSDPEngine.from_pretrained(tiny_model_dir, dp_size=2)
    import torch.distributed as dist

    assert not dist.is_initialized()  # the failed engine removed the one-rank group it made


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
