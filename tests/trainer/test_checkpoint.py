"""Recovery checkpoints of a real FSDPEngine in one process (a one-rank gloo group): a crash in
the middle of a save and a disk that fills up both leave the previous checkpoint usable."""

import errno
import os
from pathlib import Path

import pytest

from tests.engine.test_fsdp_helpers import make_batch, nll_loss, one_rank_engine, one_torch_thread, token_weight


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def test_checkpoint_crash_mid_save_keeps_previous(tiny_model_dir, tmp_path, monkeypatch):
    from areal.trainer import checkpoint as ck

    batch = make_batch(5)
    engine = one_rank_engine(tiny_model_dir)
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

    from areal.trainer import checkpoint as ck

    batch = make_batch(5)
    engine = one_rank_engine(tiny_model_dir)
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
